"""masks/flex_tiles.py: a FlexAttention BlockMask read as an attnkit mask allows what FlexAttention allows.

- from ``create_block_mask``: exactly what its mask_mod allows (torch's own dense ``create_mask``
  is the picture compared), with the sizes the block mask was made for;
- from tiles alone (no mask_mod): every entry of every listed tile;
- layouts at other block sizes, derived from the tiles, never drop an allowed entry.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, create_mask

import attnkit
from attnkit.masks.block_masks import ordered
from attnkit.masks.flex_tiles import from_block_mask
from tests.masks.test_block_masks import GYM, L


@pytest.mark.parametrize("name", list(GYM))
def test_a_block_mask_read_back_allows_what_flex_allows(name):
    heads = 3 if name == "per head" else None
    bm = create_block_mask(GYM[name], None, heads, L, L, device="cpu")
    mask = from_block_mask(bm)
    picture = mask.materialize(L, L, heads=3)
    assert torch.equal(picture, torch.broadcast_to(create_mask(GYM[name], 1, 3, L, L, device="cpu"), picture.shape))
    assert (mask.q_len, mask.kv_len, mask.num_heads) == (L, L, heads)


@pytest.mark.parametrize("block_size", [32, 64, 96, 200])
def test_layouts_at_other_block_sizes_keep_every_allowed_entry(block_size):
    bm = create_block_mask(GYM["documents"], None, None, L, L, device="cpu")
    mask = from_block_mask(bm)
    derived = mask.block_layout(L, L, block_size)
    exact = mask.block_layout(L, L, block_size, exact=True)
    assert bool((derived.active | ~exact.active).all()) and bool((exact.full | ~derived.full).all())
    assert 0 < derived.density < 1 or block_size > 128  # small blocks inside empty tiles stay empty


def test_a_block_mask_without_mask_mod_allows_its_whole_tiles():
    dense = torch.tensor([[True, False, False], [True, True, False], [False, False, True]])
    bm = BlockMask.from_kv_blocks(*ordered(dense[None, None]), BLOCK_SIZE=4, seq_lengths=(12, 12))
    picture = from_block_mask(bm).materialize(12, 12)[0, 0]
    assert torch.equal(picture, dense.repeat_interleave(4, 0).repeat_interleave(4, 1))


def test_a_block_mask_of_other_lengths_or_a_wrong_mask_mod_is_refused():
    with pytest.raises(attnkit.DTypeError, match="BlockMask"):
        from_block_mask(torch.ones(3, 3, dtype=torch.bool))
    bm = create_block_mask(lambda b, h, q, k: q >= k, None, None, 256, 256, device="cpu")
    q = torch.randn(1, 1, 128, 8)
    with pytest.raises(attnkit.ShapeError, match="q_len=256"):
        attnkit.attention(q, q, q, mask=from_block_mask(bm))
    bad = BlockMask.from_kv_blocks(bm.kv_num_blocks, bm.kv_indices, BLOCK_SIZE=128, seq_lengths=(256, 256),
                                   mask_mod=lambda b, h, q, k: (q - k).float())
    with pytest.raises(attnkit.DTypeError, match="bool"):
        from_block_mask(bad).materialize(256, 256)
