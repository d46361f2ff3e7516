"""The ring (distributed/ring.py): it never holds the whole K/V, skips and does not send empty blocks
(a halo for windows, both ways), balances causal work under zigzag, and sends the bytes its formula says."""

from __future__ import annotations

import pytest

from attnkit import masks
from attnkit.distributed import agreement, ring

from . import cases, spawn

WORLD, LENGTH = 4, 48
SIZES = {"batch": cases.BATCH, "kv_heads": cases.HEADS, "length": LENGTH, "head_dim": cases.HEAD_DIM,
         "value_dim": cases.VALUE_DIM, "world": WORLD, "itemsize": 8}
CHECK = agreement.bytes_sent(WORLD)  # every call starts with the agreement check
MASKS = {"none": None, "causal": masks.causal(), "causal_window": masks.causal() & masks.sliding_window(3),
         "window_both_sides": masks.sliding_window(3, 3)}


_MADE: list = []


class _Recorded(ring.RingPlan):
    """A RingPlan that keeps itself where the test can read it, and the K/V shapes its blocks receive."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.block_lengths = []
        _MADE.append(self)

    def _block(self, q_chunk, kv, j, a, b, d):
        self.block_lengths.append(kv.chunk(len(self.q_chunks), -2)[j].shape[-2])
        return super()._block(q_chunk, kv, j, a, b, d)


def _ring_facts(rank, world):
    ring.RingPlan = _Recorded  # attention() reads the class from the module at call time
    found = {}
    for layout in cases.LAYOUTS:
        for name, mask in MASKS.items():
            _MADE.clear()
            fwd, bwd = cases.measured_bytes("ring", layout, mask=mask, length=LENGTH)
            plan = _MADE[-1]
            found[layout, name] = {"bytes": (fwd, bwd), "sends": plan.sends(),
                                   "hops": [lane.hops for lane in plan.lanes], "peak": plan.peak_positions,
                                   "longest_block": max(plan.block_lengths, default=0),
                                   "entries": plan.entries_computed}
    return found


@pytest.fixture(scope="module")
def facts():
    return spawn.run(_ring_facts, WORLD)


@pytest.mark.parametrize("layout", cases.LAYOUTS)
@pytest.mark.parametrize("name", MASKS)
def test_no_rank_holds_the_whole_kv(facts, layout, name):
    for found in facts:
        f = found[layout, name]
        assert f["peak"] <= 3 * LENGTH // WORLD < LENGTH  # own block, current and incoming (or one per direction)
        assert f["longest_block"] <= LENGTH // WORLD


@pytest.mark.parametrize("layout", cases.LAYOUTS)
@pytest.mark.parametrize("name", MASKS)
def test_bytes_measured_equal_the_formula(facts, layout, name):
    for found in facts:
        f = found[layout, name]
        assert f["bytes"] == (ring.bytes_sent(**SIZES, sends=f["sends"]) + CHECK,  # the agreement check: forward
                              ring.bytes_sent(**SIZES, sends=f["sends"], backward=True))
    if name == "none":
        block = cases.BATCH * cases.HEADS * (LENGTH // WORLD) * (cases.HEAD_DIM + cases.VALUE_DIM) * 8
        assert all(found[layout, name]["bytes"] == ((WORLD - 1) * block + CHECK, (2 * WORLD - 1) * block)
                   for found in facts)


def test_causal_blocks_travel_only_as_far_as_needed(facts):
    causal = [found["contiguous", "causal"] for found in facts]
    assert causal[0]["hops"] == [[3, 2, 1, 0]]
    assert [f["sends"][0] for f in causal] == [1, 2, 3, 0]  # W (W - 1) / 2 sends instead of W (W - 1)
    halo = [found["contiguous", "causal_window"] for found in facts]
    assert halo[0]["hops"] == [[1, 1, 1, 0]] and [f["sends"][0] for f in halo] == [1, 1, 1, 0]
    both = [found["contiguous", "window_both_sides"] for found in facts]  # one hop each way, none around the ring
    assert both[0]["hops"] == [[1, 1, 1, 0], [0, 1, 1, 1]] and [f["sends"][0] for f in both] == [1, 2, 2, 1]
    assert [found["zigzag", "causal"]["sends"][0] for found in facts] == [WORLD - 1] * WORLD  # every rank needs all


def test_zigzag_balances_causal_work(facts):
    contiguous = [found["contiguous", "causal"]["entries"] for found in facts]
    zigzag = [found["zigzag", "causal"]["entries"] for found in facts]
    chunk = LENGTH // WORLD
    assert contiguous == [(r + 1) * chunk ** 2 for r in range(WORLD)]  # the last rank does W times the first
    assert zigzag == [(2 * WORLD + 1) * (chunk // 2) ** 2] * WORLD
    assert sum(zigzag) < sum(contiguous)  # smaller chunks also skip more of the upper triangle
