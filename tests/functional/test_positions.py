"""Masks and modifiers of a whole sequence, evaluated on a block: equal to the block of the whole picture."""

import pytest
import torch

from attnkit import bias, masks
from attnkit.functional.positions import positioned_modifier

WHOLE = 23
BLOCKS = [(0, 0, 23, 23), (22, 0, 1, 23), (5, 0, 7, 12), (9, 4, 6, 11), (17, 17, 6, 6), (3, 10, 4, 5)]
MASKS = [
    masks.causal(),
    masks.causal() & masks.sliding_window(4),
    masks.sliding_window(3, 2),
    masks.global_tokens([0, 7]) | masks.causal(),
    masks.strided(4) & masks.causal(),
    masks.segments(torch.tensor([0] * 9 + [1] * 8 + [2] * 6)),
    masks.diagonals(-5, 2),
]


@pytest.mark.parametrize("whole", MASKS, ids=repr)
@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_positioned_mask_is_the_block_of_the_whole_picture(whole, block):
    q0, k0, lq, lk = block
    picture = whole.materialize(WHOLE, WHOLE)[..., q0:q0 + lq, k0:k0 + lk]
    m = masks.positioned(whole, q_offset=q0, kv_offset=k0, length=WHOLE)
    assert torch.equal(m.materialize(lq, lk), picture)
    for bs in (2, 4):  # the layout: exact where computed from the band, else evaluated
        layout, exact = m.block_layout(lq, lk, bs), m.block_layout(lq, lk, bs, exact=True)
        assert torch.equal(layout.active | exact.active, layout.active)  # covers every allowed entry
        assert torch.equal(layout.full & exact.full, layout.full)  # claims fullness only where true


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_a_band_stays_a_band_shifted_by_the_offsets(block):
    q0, k0, lq, lk = block
    whole = masks.causal() & masks.sliding_window(4)
    assert whole.band(WHOLE, WHOLE) == (-4, 0)
    assert masks.positioned(whole, q_offset=q0, kv_offset=k0, length=WHOLE).band(lq, lk) == (-4 + q0 - k0, q0 - k0)


def test_diagonals_is_the_general_band():
    assert torch.equal(masks.diagonals(hi=0).materialize(5, 5), masks.causal().materialize(5, 5))
    assert torch.equal(masks.diagonals(hi=3).materialize(2, 5), masks.causal().materialize(2, 5))
    picture = masks.diagonals(-2, 1).materialize(4, 6)[0, 0]
    i, j = torch.arange(4)[:, None], torch.arange(6)[None, :]
    assert torch.equal(picture, (j - i >= -2) & (j - i <= 1))
    assert masks.diagonals().band(3, 3) == (None, None)
    with pytest.raises(ValueError, match="lo"):
        masks.diagonals(lo=1.5)


@pytest.mark.parametrize("modifier", [bias.alibi(3), bias.softcap(2.0),
                                      lambda s, b, h, qi, ki: s + (qi * 100 + ki).to(s.dtype)], ids=repr)
@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_positioned_modifier_is_the_block_of_the_whole(modifier, block):
    q0, k0, lq, lk = block
    scores = torch.randn(1, 3, WHOLE, WHOLE, dtype=torch.float64)
    h = torch.arange(3).view(1, -1, 1, 1)
    qi, ki = torch.arange(WHOLE).view(1, 1, -1, 1), torch.arange(WHOLE).view(1, 1, 1, -1)
    whole = bias.apply_modifier(modifier, scores, 0, h, qi, ki, WHOLE, WHOLE)[..., q0:q0 + lq, k0:k0 + lk]
    m = positioned_modifier(modifier, q_offset=q0, kv_offset=k0, length=WHOLE)
    part = bias.apply_modifier(m, scores[..., q0:q0 + lq, k0:k0 + lk].clone(), 0, h, qi[..., :lq, :],
                               ki[..., :lk], lq, lk)
    torch.testing.assert_close(part, whole, rtol=0, atol=1e-12)


def test_positioned_additive_term_stays_additive_and_softcap_unchanged():
    assert isinstance(positioned_modifier(bias.alibi(2), q_offset=1, kv_offset=0, length=4), bias.AdditiveModifier)
    cap = bias.softcap(3.0)
    assert positioned_modifier(cap, q_offset=1, kv_offset=0, length=4) is cap
    with pytest.raises(ValueError, match="q_offset"):
        masks.positioned(masks.causal(), q_offset=-1, kv_offset=0, length=4)
