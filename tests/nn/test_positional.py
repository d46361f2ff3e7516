"""Positional encodings: sinusoidal, learned, rotary, and the seeds' permutation counter-example.

References are float64 transcriptions of the papers, written with plain loops and
``math``: Vaswani et al. 2017 Sec. 3.5, Gehring et al. 2017 Sec. 3.1, and RoFormer's
rotation matrix (eq. 15), which the module computes through the efficient form (eq. 34).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck

import attnkit
from attnkit import masks
from attnkit.bias import RelativePositionBias, alibi
from attnkit.errors import ArgumentError, AttnkitError, DTypeError, ShapeError
from attnkit.nn.positional import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding
from attnkit.registry import Entry, get


def _randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


# ---------------------------------------------------------------- references (float64, from the papers)

def ref_sinusoidal(length, dim, offset=0, base=10000.0):
    pe = torch.zeros(length, dim, dtype=torch.float64)
    for t in range(length):
        pos = offset + t
        for c in range(dim):
            i = c // 2
            angle = pos / base ** (2 * i / dim)
            pe[t, c] = math.sin(angle) if c % 2 == 0 else math.cos(angle)
    return pe


def ref_rotation_matrix(m, dim, base=10000.0):
    """RoFormer eq. 15: block-diagonal 2x2 rotations by m * theta_i, theta_i = base^(-2(i-1)/d), i = 1..d/2."""
    d = dim - dim % 2  # odd dim: the last feature is passed through (documented difference)
    r = torch.eye(dim, dtype=torch.float64)
    for i in range(1, d // 2 + 1):
        theta = base ** (-2 * (i - 1) / d)
        c, s = math.cos(m * theta), math.sin(m * theta)
        a = 2 * (i - 1)
        r[a, a], r[a, a + 1], r[a + 1, a], r[a + 1, a + 1] = c, -s, s, c
    return r


def ref_rotate(x, offset, base=10000.0):
    out = torch.empty_like(x, dtype=torch.float64)
    for t in range(x.shape[-2]):
        out[..., t, :] = x[..., t, :].double() @ ref_rotation_matrix(offset + t, x.shape[-1], base).T
    return out


# ---------------------------------------------------------------- sinusoidal

@pytest.mark.parametrize("dim", [6, 11])
@pytest.mark.parametrize("offset", [0, 9])
def test_sinusoidal_matches_paper(dim, offset):
    x = _randn(2, 5, dim)
    out = SinusoidalPositionalEncoding(dim)(x, offset=offset)
    torch.testing.assert_close(out, x + ref_sinusoidal(5, dim, offset), rtol=0, atol=1e-12)


def test_sinusoidal_float32_base_and_long_lengths():
    pe = SinusoidalPositionalEncoding(11, base=500.0)
    x = torch.zeros(1, 3, 11)
    out = pe(x, offset=4997)  # no max_len: any length; angles in float64 keep the phase at large positions
    assert out.dtype == torch.float32
    torch.testing.assert_close(out[0].double(), ref_sinusoidal(3, 11, 4997, base=500.0), rtol=0, atol=1e-6)


def test_sinusoidal_offset_decoding_equals_full_pass():
    pe = SinusoidalPositionalEncoding(11)
    x = _randn(2, 7, 11)
    full = pe(x)
    for t in range(7):
        assert torch.equal(pe(x[:, t: t + 1], offset=t), full[:, t: t + 1])
    torch.testing.assert_close(pe(x[:, 3:], offset=3), full[:, 3:], rtol=0, atol=0)


def test_sinusoidal_max_len():
    pe = SinusoidalPositionalEncoding(4, max_len=8)
    assert pe(torch.zeros(2, 8, 4)).shape == (2, 8, 4)
    with pytest.raises(ShapeError, match="max_len=8"):
        pe(torch.zeros(2, 9, 4))
    with pytest.raises(ShapeError, match="max_len=8"):
        pe(torch.zeros(2, 3, 4), offset=6)


def test_sinusoidal_dropout_only_in_training():
    torch.manual_seed(0)
    pe = SinusoidalPositionalEncoding(11, dropout=0.5)
    x = _randn(2, 5, 11, dtype=torch.float32)
    clean = x + pe.encoding(5)
    pe.eval()
    assert torch.equal(pe(x), clean) and torch.equal(pe(x), pe(x))
    pe.train()
    out = pe(x)
    dropped = out == 0
    assert dropped.any() and (~dropped).any()
    torch.testing.assert_close(out[~dropped], 2 * clean[~dropped])


def test_sinusoidal_gradcheck_and_state_dict():
    pe = SinusoidalPositionalEncoding(11)
    x = _randn(2, 5, 11).requires_grad_()
    assert gradcheck(lambda t: pe(t, offset=2), (x,))
    assert list(pe.state_dict()) == []  # nothing stored: computed on the fly
    other = SinusoidalPositionalEncoding(11)
    other.load_state_dict(pe.state_dict())
    assert torch.equal(other(x), pe(x))


@pytest.mark.parametrize("make", [
    lambda: SinusoidalPositionalEncoding(0),
    lambda: SinusoidalPositionalEncoding(4, base=1.0),
    lambda: SinusoidalPositionalEncoding(4, dropout=1.0),
    lambda: SinusoidalPositionalEncoding(4, max_len=0),
    lambda: LearnedPositionalEmbedding(0, 4),
    lambda: RotaryEmbedding(4, base=float("nan")),
])
def test_bad_constructor_arguments(make):
    with pytest.raises(ArgumentError):
        make()


@pytest.mark.parametrize("module", [SinusoidalPositionalEncoding(4), LearnedPositionalEmbedding(8, 4)])
def test_bad_inputs(module):
    with pytest.raises(ShapeError, match=r"\(batch, n, dim=4\).*\(5, 4\)"):
        module(torch.zeros(5, 4))
    with pytest.raises(ShapeError, match="dim=4"):
        module(torch.zeros(2, 5, 3))
    with pytest.raises(DTypeError, match="floating"):
        module(torch.zeros(2, 5, 4, dtype=torch.long))
    for bad in (-1, True, 1.5):
        with pytest.raises(ArgumentError, match="offset"):
            module(torch.zeros(2, 5, 4), offset=bad)


# ---------------------------------------------------------------- learned

def test_learned_matches_transcription_and_offset():
    torch.manual_seed(0)
    emb = LearnedPositionalEmbedding(12, 11).double()
    x = _randn(2, 5, 11)
    out = emb(x, offset=4)
    expect = torch.empty_like(x)
    for b in range(2):
        for t in range(5):
            expect[b, t] = x[b, t] + emb.weight[4 + t]
    assert torch.equal(out, expect)
    full = emb(_randn(2, 9, 11))
    for t in range(9):
        assert torch.equal(emb(_randn(2, 9, 11)[:, t: t + 1], offset=t), full[:, t: t + 1])


def test_learned_raises_past_max_len():
    emb = LearnedPositionalEmbedding(8, 4)
    assert emb(torch.zeros(1, 8, 4)).shape == (1, 8, 4)
    with pytest.raises(ShapeError, match="max_len=8"):
        emb(torch.zeros(1, 9, 4))
    with pytest.raises(ShapeError, match=r"offset=5.*max_len=8"):
        emb(torch.zeros(1, 4, 4), offset=5)
    with pytest.raises(AttnkitError):
        emb(torch.zeros(1, 1, 4), offset=8)


def test_learned_gradcheck_and_gradient_rows():
    torch.manual_seed(0)
    emb = LearnedPositionalEmbedding(9, 3).double()
    x = _randn(2, 5, 3).requires_grad_()
    w = emb.weight.detach().clone().requires_grad_()
    fn = lambda w_, x_: torch.func.functional_call(emb, {"weight": w_}, (x_,), {"offset": 2})
    assert gradcheck(fn, (w, x))
    emb(x, offset=2).sum().backward()
    used = torch.zeros(9, dtype=torch.bool)
    used[2:7] = True
    assert (emb.weight.grad[~used] == 0).all() and (emb.weight.grad[used] == 2).all()  # summed over batch


def test_learned_state_dict_round_trip_and_init():
    torch.manual_seed(0)
    emb = LearnedPositionalEmbedding(64, 32)
    assert list(emb.state_dict()) == ["weight"] and emb.weight.shape == (64, 32)
    assert 0.09 < emb.weight.std().item() < 0.11  # N(0, 0.1^2) as the paper's embeddings
    other = LearnedPositionalEmbedding(64, 32)
    assert not torch.equal(other.weight, emb.weight)
    other.load_state_dict(emb.state_dict())
    x = _randn(2, 5, 32, dtype=torch.float32)
    assert torch.equal(other(x), emb(x))


# ---------------------------------------------------------------- rotary

@pytest.mark.parametrize("dim", [8, 11])
def test_rotary_matches_rotation_matrix(dim):
    rope = RotaryEmbedding(dim, base=100.0)
    q, k = _randn(2, 3, 5, dim), _randn(2, 3, 7, dim, seed=1)
    q_rot, k_rot = rope(q, k, q_offset=6, k_offset=4)
    torch.testing.assert_close(q_rot, ref_rotate(q, 6, base=100.0), rtol=0, atol=1e-12)
    torch.testing.assert_close(k_rot, ref_rotate(k, 4, base=100.0), rtol=0, atol=1e-12)


def test_rotary_odd_dim_leaves_last_feature():
    x = _randn(2, 3, 5, 11)
    out = RotaryEmbedding(11).rotate(x, offset=3)
    assert torch.equal(out[..., 10], x[..., 10])
    torch.testing.assert_close(out[..., :10], RotaryEmbedding(10).rotate(x[..., :10], offset=3), rtol=0, atol=0)
    assert torch.equal(RotaryEmbedding(1).rotate(x[..., :1]), x[..., :1])


@settings(max_examples=25, deadline=None)
@given(m=st.integers(0, 3000), n=st.integers(0, 3000), shift=st.integers(0, 3000), seed=st.integers(0, 100))
def test_rotary_scores_depend_only_on_relative_position(m, n, shift, seed):
    rope = RotaryEmbedding(11)
    q, k = _randn(1, 11, seed=seed), _randn(1, 11, seed=seed + 1)
    score = (rope.rotate(q, offset=m) * rope.rotate(k, offset=n)).sum()
    shifted = (rope.rotate(q, offset=m + shift) * rope.rotate(k, offset=n + shift)).sum()
    assert abs(score.item() - shifted.item()) < 1e-9
    # eq. 16: q^T R_{n-m} k, with the relative rotation alone
    assert abs(score.item() - (q @ ref_rotation_matrix(n - m, 11) @ k.T).item()) < 1e-9


def test_rotary_relative_property_fails_for_absolute_encoding():
    # the property above is not vacuous: an additive absolute encoding breaks it
    pe = SinusoidalPositionalEncoding(11)
    q, k = _randn(1, 1, 11), _randn(1, 1, 11, seed=1)
    s1 = (pe(q, offset=2) * pe(k, offset=5)).sum()
    s2 = (pe(q, offset=12) * pe(k, offset=15)).sum()
    assert abs(s1 - s2) > 1e-3


def test_rotary_decoding_with_offsets_equals_full_causal_pass():
    rope = RotaryEmbedding(11)
    q, k, v = _randn(2, 3, 7, 11), _randn(2, 3, 7, 11, seed=1), _randn(2, 3, 7, 5, seed=2)
    full = attnkit.attention(*rope(q, k), v, mask=masks.causal())
    cache = torch.cat([rope.rotate(k[:, :, j: j + 1], offset=j) for j in range(7)], dim=2)  # rotated on append
    for p in range(7):
        q_p = rope.rotate(q[:, :, p: p + 1], offset=p)  # one query at absolute position p
        out = attnkit.attention(q_p, cache[:, :, : p + 1], v[:, :, : p + 1], mask=masks.causal())
        torch.testing.assert_close(out, full[:, :, p: p + 1], rtol=0, atol=1e-12)
    # chunked prefill: the last 3 queries against all 7 keys, bottom-right
    q_r, k_r = rope(q[:, :, 4:], k, q_offset=4)
    torch.testing.assert_close(attnkit.attention(q_r, k_r, v, mask=masks.causal()), full[:, :, 4:], rtol=0,
                               atol=1e-12)
    wrong, _ = rope(q[:, :, 4:], k)  # forgetting the offset changes the answer
    assert not torch.allclose(attnkit.attention(wrong, k_r, v, mask=masks.causal()), full[:, :, 4:], atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_low_precision_dtypes(dtype):
    rope = RotaryEmbedding(8)
    x = _randn(2, 3, 5, 8, dtype=dtype)
    out = rope.rotate(x, offset=1_000_000)
    assert out.dtype == dtype
    exact = ref_rotate(x, 1_000_000)
    err = (out.double() - exact).abs().max().item()
    plain = (exact.to(dtype).double() - exact).abs().max().item()  # rounding the exact answer once
    assert err <= 2 * plain + 1e-6


def test_rotary_gradcheck_state_dict_and_errors():
    rope = RotaryEmbedding(11)
    q, k = _randn(2, 3, 5, 11).requires_grad_(), _randn(2, 1, 7, 11, seed=1).requires_grad_()
    small = RotaryEmbedding(5)
    assert gradcheck(lambda a, b: small(a, b, q_offset=2, k_offset=1), (q[:1, :1, :3, :5], k[:1, :, :4, :5]))
    assert list(rope.state_dict()) == [] and list(rope.parameters()) == []
    with pytest.raises(ShapeError, match=r"k must have shape .*dim=11.*\(2, 3, 7, 8\)"):
        rope(q, torch.zeros(2, 3, 7, 8))
    with pytest.raises(ArgumentError, match="q_offset"):
        rope(q, k, q_offset=-1)
    with pytest.raises(DTypeError, match="q must be a floating"):
        rope(torch.zeros(2, 3, 5, 11, dtype=torch.long), k)


# ---------------------------------------------------------------- the seeds' counter-example

B, N, E, H = 2, 7, 12, 3
PERM = torch.tensor([3, 0, 6, 1, 5, 2, 4])  # neither the identity nor the reversal (ALiBi is reversal-symmetric)


def _self_attention(x, encoding):
    g = torch.Generator().manual_seed(42)
    w_q, w_k, w_v = (torch.randn(E, E, generator=g, dtype=torch.float64) / E ** 0.5 for _ in range(3))
    bias = None
    if encoding == "sinusoidal":
        x = SinusoidalPositionalEncoding(E)(x)
    elif encoding == "learned":
        torch.manual_seed(1)
        x = LearnedPositionalEmbedding(N, E).double()(x)
    heads = lambda t: t.unflatten(-1, (H, E // H)).transpose(1, 2)  # (B, N, E) -> (B, H, N, E/H)
    q, k, v = heads(x @ w_q), heads(x @ w_k), heads(x @ w_v)
    if encoding == "rotary":
        q, k = RotaryEmbedding(E // H)(q, k)
    elif encoding == "alibi":
        bias = alibi(H)
    elif encoding == "relative":
        bias = RelativePositionBias(H, num_buckets=8, max_distance=16).double()
        with torch.no_grad():
            bias.table.copy_(_randn(H, 8, seed=3))
    return attnkit.attention(q, k, v, bias=bias).transpose(1, 2).flatten(2)  # (B, N, E)


def test_self_attention_without_positions_is_permutation_equivariant():
    x = _randn(B, N, E)
    torch.testing.assert_close(_self_attention(x[:, PERM], None), _self_attention(x, None)[:, PERM],
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("encoding", ["sinusoidal", "learned", "rotary", "alibi", "relative"])
def test_self_attention_with_positions_is_not_permutation_equivariant(encoding):
    x = _randn(B, N, E)
    gap = (_self_attention(x[:, PERM], encoding) - _self_attention(x, encoding)[:, PERM]).abs().max().item()
    assert gap > 1e-3, f"{encoding}: output still permutation equivariant (gap {gap:.2g})"


# ---------------------------------------------------------------- registry

@pytest.mark.parametrize("name", ["sinusoidal-positional-encoding", "learned-positional-embedding",
                                  "rotary-embedding", "relative-position-bias"])
def test_registry_entries_run(name):
    entry = get(name)
    assert isinstance(entry, Entry) and entry.family == "positional" and "arXiv" in entry.paper
    fn, inputs = entry.example()
    out = fn(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    assert all(torch.isfinite(o).all() for o in outs)
    assert outs[0].shape == inputs[0].shape[:-1] + (outs[0].shape[-1],)
