"""Retention and gated linear attention reduce to what is known: plain causal linear attention, the decay-mask form."""

import pytest
import torch
import torch.nn.functional as F

from attnkit.errors import ArgumentError, ShapeError
from attnkit.functional.recurrences import FORMS, gated_linear_attention, retention
from attnkit.nn.linear import causal_sums

from .cases import qkv

TOL = dict(rtol=0, atol=1e-10)


@pytest.mark.parametrize("form", FORMS)
def test_no_decay_is_plain_causal_linear_attention(form):
    q, k, v = qkv()
    plain = causal_sums(q * 5 ** -0.5, k, v, 4)[0]  # LinearAttention's numerator with the identity feature map
    out_r, _ = retention(q, k, v, torch.ones(3, dtype=torch.float64), form=form, chunk_size=3)
    out_g, _ = gated_linear_attention(q, k, v, torch.zeros(2, 3, 11, 5, dtype=torch.float64), form=form, chunk_size=3)
    torch.testing.assert_close(out_r, plain, **TOL)
    torch.testing.assert_close(out_g, plain, **TOL)


@pytest.mark.parametrize("form", FORMS)
def test_retention_is_attention_with_the_decay_mask(form):
    q, k, v = qkv(1)
    gamma = torch.tensor([0.9, 0.6, 0.99], dtype=torch.float64)
    n = q.shape[2]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    mask = torch.where(i >= j, gamma[:, None, None] ** (i - j).clamp(min=0), 0.0)  # D_nm = gamma^(n - m), n >= m
    want = ((q @ k.transpose(-1, -2)) * 5 ** -0.5 * mask) @ v
    torch.testing.assert_close(retention(q, k, v, gamma, form=form, chunk_size=4)[0], want, **TOL)


def test_equal_channel_gates_are_a_decay_per_head():
    q, k, v = qkv(2)
    gamma = torch.tensor([0.8, 0.3, 0.95], dtype=torch.float64)
    g = gamma.log()[:, None, None].expand(2, 3, 11, 5)
    for form in FORMS:
        torch.testing.assert_close(gated_linear_attention(q, k, v, g, form=form)[0],
                                   retention(q, k, v, gamma, form=form)[0], **TOL)


def test_strong_gates_stay_finite_in_float32():
    q, k, v = (t.float() for t in qkv(3, n=200))
    g = F.logsigmoid(torch.randn(2, 3, 200, 5) * 10) * 20  # down to exp(-700) within a block
    out, state = gated_linear_attention(q, k, v, g, chunk_size=64)
    ref, _ = gated_linear_attention(q, k, v, g, form="recurrent")
    assert torch.isfinite(out).all() and torch.isfinite(state).all()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_bad_decays_and_gates_are_named():
    q, k, v = qkv()
    with pytest.raises(ArgumentError, match=r"decay must lie in \(0, 1\]"):
        retention(q, k, v, torch.tensor([0.5, 1.5, 0.2], dtype=torch.float64))
    with pytest.raises(ShapeError, match=r"decay must have shape \(H,\) = \(3,\); got \(2,\)"):
        retention(q, k, v, torch.tensor([0.5, 0.5]))
    with pytest.raises(ShapeError, match=r"g must have shape \(B, H, L, Dk\) = \(2, 3, 11, 5\); got \(2, 3, 11\)"):
        gated_linear_attention(q, k, v, torch.zeros(2, 3, 11))


@pytest.mark.parametrize("form", FORMS)
def test_retention_with_log_decays_per_token_is_the_decay_mask_of_their_segment_sums(form):
    """``g`` per token: ``log gamma_h`` everywhere is the fixed decay; a token with ``g = 0`` and a zero key (a
    padded one) neither decays nor writes, so the others' outputs are those of the sequence without it."""
    q, k, v = qkv(4)
    gamma = torch.tensor([0.9, 0.6, 0.99], dtype=torch.float64)
    fixed = gamma.log()[:, None].expand(2, 3, 11)
    torch.testing.assert_close(retention(q, k, v, g=fixed, form=form, chunk_size=4)[0],
                               retention(q, k, v, gamma, form=form, chunk_size=4)[0], **TOL)
    keep = torch.ones(11, dtype=torch.bool)
    keep[[0, 4, 5]] = False
    g = fixed.masked_fill(~keep, 0.0)
    out, state = retention(q, k.masked_fill(~keep[:, None], 0.0), v, g=g, form=form, chunk_size=4)
    alone, alone_state = retention(q[:, :, keep], k[:, :, keep], v[:, :, keep], gamma, form="parallel")
    torch.testing.assert_close(out[:, :, keep], alone, **TOL)
    torch.testing.assert_close(state, alone_state, **TOL)


def test_retention_takes_exactly_one_of_decay_and_g():
    q, k, v = qkv()
    with pytest.raises(ArgumentError, match=r"retention: give exactly one of decay \(H,\) and g \(B, H, L\); got "
                                            "neither"):
        retention(q, k, v)
    with pytest.raises(ArgumentError, match="got both"):
        retention(q, k, v, torch.ones(3, dtype=torch.float64), g=torch.zeros(2, 3, 11, dtype=torch.float64))
    with pytest.raises(ShapeError, match=r"g must have shape \(B, H, L\) = \(2, 3, 11\); got \(3,\)"):
        retention(q, k, v, g=torch.zeros(3, dtype=torch.float64))
