"""accounting.py: the bytes each scheme's formula predicts equal the bytes counted on the collectives."""

from __future__ import annotations

import itertools

import pytest
import torch

from attnkit import masks
from attnkit.distributed import SCHEMES

from . import cases, spawn

WORLD = 3
MASKS = {"none": None, "causal": masks.causal(), "window_both_sides": masks.sliding_window(2, 2)}
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def _measure(rank, world):
    return {(s, lay, m, d, lse): cases.measured_bytes(s, lay, mask=MASKS[m], kv_heads=4, dtype=DTYPES[d],
                                                      return_lse=lse, expected=True)
            for s, lay, m, d, lse in itertools.product(SCHEMES, cases.LAYOUTS, MASKS, DTYPES, (False, True))
            if d == "float64" or m == "causal"}


@pytest.fixture(scope="module")
def measured():
    return spawn.run(_measure, WORLD)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("layout", cases.LAYOUTS)
def test_measured_bytes_equal_the_formula(measured, scheme, layout):
    checked = 0
    for rank, found in enumerate(measured):
        for key, (got, want) in found.items():
            if key[:2] == (scheme, layout):
                assert got == want, f"rank {rank} {key}: measured {got}, formula {want}"
                assert got[0] > 0 or (scheme == "ring" and key[2] != "none")  # only the ring skips sends
                checked += 1
    assert checked == WORLD * (len(MASKS) * 2 + (len(DTYPES) - 1) * 2)
