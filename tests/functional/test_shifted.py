"""masks.shifted and functional/shifted.py: a shifted mask or modifier is the slice of the global one."""

from __future__ import annotations

import pytest
import torch

from attnkit import bias, masks
from attnkit.functional.shifted import shift_modifier
from attnkit.masks import ShiftedMask

L = 24
_IDS = torch.tensor([[0] * 5 + [1] * 9 + [2] * 10, [0] * 12 + [3] * 12])
MASKS = {
    "causal": masks.causal(), "window": masks.sliding_window(3, 2), "causal_window": masks.causal()
    & masks.sliding_window(4), "segments": masks.segments(_IDS), "padding": masks.padding([20, 7]),
    "documents_causal": masks.segments(_IDS) & masks.causal(), "strided": masks.strided(5),
    "heads": masks.from_function(lambda b, h, i, j: (i + 2 * j + h) % 3 == 0, "by_head"),
    "tensor": masks.TensorMask(torch.rand(2, 4, L, L, generator=torch.Generator().manual_seed(0)) < 0.5),
}
BLOCKS = [(0, 6, 0, 6), (6, 6, 0, 6), (12, 6, 18, 6), (18, 6, 6, 12), (3, 5, 9, 7)]


@pytest.mark.parametrize("name", MASKS)
@pytest.mark.parametrize(("q0", "nq", "k0", "nk"), BLOCKS)
def test_shifted_mask_is_the_slice_of_the_global_mask(name, q0, nq, k0, nk):
    mask = MASKS[name]
    whole = torch.broadcast_to(mask.materialize(L, L, batch=2, heads=4), (2, 4, L, L))
    for h0, nh in ((0, 4), (2, 2)):
        local = masks.shifted(mask, q0=q0, k0=k0, h0=h0, q_len=L, kv_len=L)
        got = local.materialize(nq, nk, batch=2, heads=nh)
        want = whole[:, h0:h0 + nh, q0:q0 + nq, k0:k0 + nk]
        assert torch.equal(torch.broadcast_to(got, want.shape), want)
        band = local.band(nq, nk)
        if band is not None:  # a band claim must be exact on the block
            i, j = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
            lo, hi = (-L if band[0] is None else band[0]), (L if band[1] is None else band[1])
            assert torch.equal(want[0, 0], (j - i >= lo) & (j - i <= hi))


def test_diagonal_causal_block_is_plain_causal_and_data_masks_stay_shifted():
    assert repr(masks.shifted(masks.causal(), q0=6, k0=6, q_len=L, kv_len=L)) == "causal(align='top_left')"
    assert isinstance(masks.shifted(masks.causal() & masks.padding([3, 4]), q0=6, k0=6, q_len=L, kv_len=L), ShiftedMask)
    assert masks.shifted(None, q_len=L, kv_len=L) is None
    kp = masks.shifted(masks.padding([20, 7]) & masks.causal(), q0=0, k0=12, q_len=L, kv_len=L).key_padding()
    assert kp.materialize(1, 12, batch=2)[:, 0, 0].tolist() == [[j + 12 < 20 for j in range(12)], [False] * 12]


MODIFIERS = {"alibi": bias.alibi(4), "alibi_tl": bias.ALiBi(4, align="top_left"), "softcap": bias.softcap(2.0),
             "callable": lambda s, b, h, i, j: s + 0.1 * h * (i - 2 * j), "relative": bias.RelativePositionBias(4)}


@pytest.mark.parametrize("name", MODIFIERS)
@pytest.mark.parametrize(("q0", "nq", "k0", "nk"), BLOCKS)
def test_shifted_modifier_is_the_slice_of_the_global_modifier(name, q0, nq, k0, nk):
    mod = MODIFIERS[name]
    if name == "relative":
        torch.nn.init.normal_(mod.table, generator=torch.Generator().manual_seed(1))
    scores = torch.randn(2, 4, L, L, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    b, h = torch.arange(2).view(-1, 1, 1, 1), torch.arange(4).view(1, -1, 1, 1)
    idx = lambda n, o: torch.arange(n).view(1, 1, -1, 1) + o
    whole = bias.apply_modifier(mod, scores.clone(), b, h, idx(L, 0), idx(L, 0).transpose(2, 3), L, L)
    local = shift_modifier(mod, q0=q0, k0=k0, h0=1, q_len=L, kv_len=L)
    block = scores[:, 1:, q0:q0 + nq, k0:k0 + nk]
    got = bias.apply_modifier(local, block, b, h[:, :3], idx(nq, 0), idx(nk, 0).transpose(2, 3), nq, nk)
    assert torch.allclose(got, whole[:, 1:, q0:q0 + nq, k0:k0 + nk], rtol=0, atol=1e-12)
    if isinstance(mod, bias.AdditiveModifier):
        rel = idx(nk, 0).transpose(2, 3) - idx(nq, 0)
        term = local.relative_term(h[:, :3], rel, nq, nk)
        assert torch.allclose(block + term, whole[:, 1:, q0:q0 + nq, k0:k0 + nk], rtol=0, atol=1e-6)


# As a KV cache uses them: the block of the whole picture, layouts included.
WHOLE_LEN = 23
CACHE_BLOCKS = [(0, 0, 23, 23), (22, 0, 1, 23), (5, 0, 7, 12), (9, 4, 6, 11), (17, 17, 6, 6), (3, 10, 4, 5)]
CACHE_MASKS = [
    masks.causal(),
    masks.causal() & masks.sliding_window(4),
    masks.sliding_window(3, 2),
    masks.global_tokens([0, 7]) | masks.causal(),
    masks.strided(4) & masks.causal(),
    masks.segments(torch.tensor([0] * 9 + [1] * 8 + [2] * 6)),
    masks.diagonals(-5, 2),
]


@pytest.mark.parametrize("whole", CACHE_MASKS, ids=repr)
@pytest.mark.parametrize("block", CACHE_BLOCKS, ids=str)
def test_shifted_mask_is_the_block_of_the_whole_picture(whole, block):
    q0, k0, lq, lk = block
    picture = whole.materialize(WHOLE_LEN, WHOLE_LEN)[..., q0:q0 + lq, k0:k0 + lk]
    m = masks.shifted(whole, q0=q0, k0=k0, q_len=WHOLE_LEN, kv_len=WHOLE_LEN)
    assert torch.equal(m.materialize(lq, lk), picture)
    for bs in (2, 4):  # the layout: exact where computed from the band, else evaluated
        layout, exact = m.block_layout(lq, lk, bs), m.block_layout(lq, lk, bs, exact=True)
        assert torch.equal(layout.active | exact.active, layout.active)  # covers every allowed entry
        assert torch.equal(layout.full & exact.full, layout.full)  # claims fullness only where true


@pytest.mark.parametrize("block", CACHE_BLOCKS, ids=str)
def test_a_band_stays_a_band_shifted_by_the_offsets(block):
    q0, k0, lq, lk = block
    whole = masks.causal() & masks.sliding_window(4)
    assert whole.band(WHOLE_LEN, WHOLE_LEN) == (-4, 0)
    assert masks.shifted(whole, q0=q0, k0=k0, q_len=WHOLE_LEN, kv_len=WHOLE_LEN).band(lq, lk) == (-4 + q0 - k0, q0 - k0)


@pytest.mark.parametrize("modifier", [bias.alibi(3), bias.softcap(2.0),
                                      lambda s, b, h, qi, ki: s + (qi * 100 + ki).to(s.dtype)], ids=repr)
@pytest.mark.parametrize("block", CACHE_BLOCKS, ids=str)
def test_shifted_modifier_is_the_block_of_the_whole(modifier, block):
    q0, k0, lq, lk = block
    scores = torch.randn(1, 3, WHOLE_LEN, WHOLE_LEN, dtype=torch.float64)
    h = torch.arange(3).view(1, -1, 1, 1)
    qi, ki = torch.arange(WHOLE_LEN).view(1, 1, -1, 1), torch.arange(WHOLE_LEN).view(1, 1, 1, -1)
    whole = bias.apply_modifier(modifier, scores, 0, h, qi, ki, WHOLE_LEN, WHOLE_LEN)[..., q0:q0 + lq, k0:k0 + lk]
    m = shift_modifier(modifier, q0=q0, k0=k0, q_len=WHOLE_LEN, kv_len=WHOLE_LEN)
    part = bias.apply_modifier(m, scores[..., q0:q0 + lq, k0:k0 + lk].clone(), 0, h, qi[..., :lq, :],
                               ki[..., :lk], lq, lk)
    torch.testing.assert_close(part, whole, rtol=0, atol=1e-12)
