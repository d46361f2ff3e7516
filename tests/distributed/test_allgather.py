"""All-gather attention (distributed/allgather.py): the bytes it sends against its formula."""

from __future__ import annotations

import pytest

from attnkit import masks
from attnkit.distributed import agreement, allgather

from . import cases, spawn

WORLD = 3


def _bytes(rank, world):
    return {(layout, kv): cases.measured_bytes("allgather", layout, kv_heads=kv, mask=masks.causal())
            for layout in cases.LAYOUTS for kv in (cases.HEADS, 4)}


@pytest.fixture(scope="module")
def measured():
    return spawn.run(_bytes, WORLD)


@pytest.mark.parametrize("layout", cases.LAYOUTS)
@pytest.mark.parametrize("kv_heads", [cases.HEADS, 4])
def test_bytes_measured_equal_the_formula(measured, layout, kv_heads):
    want = allgather.bytes_sent(batch=cases.BATCH, kv_heads=kv_heads, length=cases.LENGTH, head_dim=cases.HEAD_DIM,
                                value_dim=cases.VALUE_DIM, world=WORLD, itemsize=8)
    block = cases.BATCH * kv_heads * (cases.LENGTH // WORLD) * (cases.HEAD_DIM + cases.VALUE_DIM) * 8
    assert want == (WORLD - 1) * block
    for found in measured:
        # all-gather forward (after the agreement check), reduce-scatter backward
        assert found[layout, kv_heads] == (want + agreement.bytes_sent(WORLD), want)
