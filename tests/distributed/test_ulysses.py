"""Ulysses (distributed/ulysses.py): K/V head repetition rule and the bytes it sends against its formula."""

from __future__ import annotations

import math

import pytest

from attnkit import masks
from attnkit.distributed import agreement, ulysses

from . import cases, spawn

WORLD = 4


@pytest.mark.parametrize(("kv_heads", "world"), [(1, 4), (2, 4), (4, 4), (6, 4), (4, 3), (3, 3), (12, 8)])
def test_kv_repeat_makes_the_kv_heads_divisible_and_keeps_every_group(kv_heads, world):
    g = ulysses.kv_repeat(kv_heads, world)
    assert (kv_heads * g) % world == 0
    heads = kv_heads * world // math.gcd(kv_heads, world)  # a query head count W divides, grouped over kv_heads
    assert (heads // kv_heads) % g == 0  # each query head still maps to its own K/V head after repeating


def _bytes(rank, world):
    return {(layout, kv, lse): cases.measured_bytes("ulysses", layout, kv_heads=kv, mask=masks.causal(),
                                                    return_lse=lse)
            for layout in cases.LAYOUTS for kv in (cases.HEADS, 2) for lse in (False, True)}


@pytest.fixture(scope="module")
def measured():
    return spawn.run(_bytes, WORLD)


@pytest.mark.parametrize("layout", cases.LAYOUTS)
@pytest.mark.parametrize("kv_heads", [cases.HEADS, 2])
@pytest.mark.parametrize("lse", [False, True])
def test_bytes_measured_equal_the_formula(measured, layout, kv_heads, lse):
    want = ulysses.bytes_sent(batch=cases.BATCH, heads=cases.HEADS, kv_heads=kv_heads, length=cases.LENGTH,
                              head_dim=cases.HEAD_DIM, value_dim=cases.VALUE_DIM, world=WORLD, itemsize=8,
                              lse_itemsize=8 if lse else 0)
    for found in measured:
        assert found[layout, kv_heads, lse] == (want + agreement.bytes_sent(WORLD), want)  # the check: forward


def test_formula_counts_the_share_for_other_ranks():
    one = ulysses.bytes_sent(batch=1, heads=4, kv_heads=4, length=8, head_dim=2, value_dim=2, world=4, itemsize=4)
    assert one == 3 * 2 * (4 * 2 + 4 * 4 + 4 * 2) * 4 // 4  # (W-1)/W of q, k, v and out of 2 rows
