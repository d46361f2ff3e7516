"""masks/block_masks.py: attnkit masks as FlexAttention's BlockMask, with the tiles torch builds.

- an attnkit mask's BlockMask has the tiles ``create_block_mask`` builds from the mask's own
  predicate (the partial tiles at a sequence's end included), read from its analytic layout,
  and FlexAttention runs it to attnkit's answer;
- a BlockMask from ``create_block_mask`` read back (:mod:`attnkit.masks.flex_tiles`) and
  turned into a BlockMask again keeps its tiles: the round trip is lossless.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, create_mask

import attnkit
from attnkit import masks
from attnkit.masks.block_masks import mask_mod, to_block_mask
from attnkit.masks.flex_tiles import from_block_mask

L = 300  # not a multiple of the 128 tile: the last tiles are cut
DOCS = torch.tensor([0] * 70 + [1] * 150 + [2] * 80)
GYM = {  # attention-gym's mask_mods, written as users write them for FlexAttention
    "causal": lambda b, h, q, k: q >= k,
    "sliding window": lambda b, h, q, k: (q - k).abs() <= 40,
    "prefix LM": lambda b, h, q, k: (k < 50) | (q >= k),
    "documents": lambda b, h, q, k: (DOCS[q] == DOCS[k]) & (q >= k),
    "dilated": lambda b, h, q, k: ((q - k) % 4 == 0) & ((q - k).abs() < 100),
    "global + window": lambda b, h, q, k: (k < 4) | (q < 4) | ((q - k).abs() <= 20),
    "per head": lambda b, h, q, k: (q - k).abs() <= 16 * (h + 1),
}
TILES = ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks")


def _ordered_equal(a: BlockMask, b: BlockMask) -> None:
    """Same tile counts, and the same tiles in every row (indices past a row's count are unused)."""
    for name in TILES:
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for num, idx in (("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices"),
                     ("q_num_blocks", "q_indices"), ("full_q_num_blocks", "full_q_indices")):
        used = torch.arange(getattr(a, idx).shape[-1]) < getattr(a, num)[..., None]
        assert torch.equal(getattr(a, idx)[used], getattr(b, idx)[used]), idx
    assert a.seq_lengths == b.seq_lengths and a.BLOCK_SIZE == b.BLOCK_SIZE


@pytest.mark.parametrize("name", list(GYM))
def test_the_round_trip_keeps_the_tiles_create_block_mask_builds(name):
    heads = 3 if name == "per head" else None
    bm = create_block_mask(GYM[name], None, heads, L, L, device="cpu")
    again = from_block_mask(bm).to_block_mask(L, L, heads=heads)
    _ordered_equal(bm, again)


ATTNKIT = {  # an attnkit mask, and the same predicate written for create_block_mask
    "causal": (masks.causal(), GYM["causal"]),
    "causal window": (masks.causal() & masks.sliding_window(40), lambda b, h, q, k: (q >= k) & (q - k <= 40)),
    "strided": (masks.causal() & masks.strided(17),
                lambda b, h, q, k: (q >= k) & (((q - k) < 17) | ((q - k) % 17 == 0))),
    "prefix LM": (masks.prefix_lm(50), GYM["prefix LM"]),
    "documents": (masks.segments(DOCS) & masks.causal(), GYM["documents"]),
    "padding": (masks.padding([L, 123]), lambda b, h, q, k: k < torch.tensor([L, 123])[b]),
}


@pytest.mark.parametrize("name", list(ATTNKIT))
@pytest.mark.parametrize("exact", [False, True])
def test_an_attnkit_mask_as_a_block_mask_has_the_tiles_torch_builds(name, exact):
    mask, written = ATTNKIT[name]
    batch = 2 if name == "padding" else None
    ours = mask.to_block_mask(L, L, batch=batch, exact=exact)
    torchs = create_block_mask(written, batch, None, L, L, device="cpu")
    if exact or name != "strided":  # strided's analytic layout over-approximates the partial tiles
        _ordered_equal(ours, torchs)
    assert torch.equal(create_mask(ours.mask_mod, batch or 1, 1, L, L, device="cpu"),
                       create_mask(written, batch or 1, 1, L, L, device="cpu"))


def test_flex_runs_the_block_mask_of_an_attnkit_mask():
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = (torch.randn(2, 3, L, 16, generator=torch.Generator().manual_seed(i)) for i in range(3))
    mask = masks.causal() & masks.sliding_window(40)
    want = attnkit.attention(q, k, v, mask=mask, backend="reference")
    torch.testing.assert_close(flex_attention(q, k, v, block_mask=mask.to_block_mask(L, L)), want,
                               rtol=1e-5, atol=1e-5)


def test_mask_mod_reads_the_mask_at_the_call_lengths_with_32_bit_indices():
    mod = mask_mod(masks.causal(), 3, 5)  # bottom-right: query i sees keys j <= i + 2
    i32 = lambda n: torch.tensor(n, dtype=torch.int32)
    assert bool(mod(i32(0), i32(0), i32(0), i32(2))) and not bool(mod(i32(0), i32(0), i32(0), i32(3)))


def test_bad_arguments_are_refused():
    with pytest.raises(attnkit.ArgumentError, match="block_size"):
        to_block_mask(masks.causal(), 8, 8, block_size=0)
