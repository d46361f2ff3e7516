"""LuongAttention (Luong et al. 2015) against a float64 loop transcription of eqs. 5 and 7-10."""

from __future__ import annotations

import math

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.errors import ArgumentError, ShapeError
from attnkit.nn.additive import AdditiveAttention
from attnkit.nn.luong import LuongAttention

B, LQ, LK, DQ, DK, A, OUT = 2, 5, 7, 11, 6, 4, 3
SCORES = ("dot", "general", "concat")
MODES = ("global", "local-m", "local-p")


def _inputs(dk=DK, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, LQ, DQ, generator=g, dtype=torch.float64)
    mem = torch.randn(B, LK, dk, generator=g, dtype=torch.float64)
    return q.requires_grad_(requires_grad), mem.requires_grad_(requires_grad)


def _module(score, mode, seed=0, **kwargs):
    torch.manual_seed(seed)
    dk = DQ if score == "dot" else DK
    kwargs.setdefault("window", 2)
    return LuongAttention(DQ, dk, score=score, mode=mode, hidden_dim=A, out_dim=OUT, **kwargs).double()


def _score(m, h_t, h_s):
    """Eq. 8."""
    if m.score_name == "dot":
        return h_t @ h_s
    if m.score_name == "general":
        return h_t @ (m.w_a.detach() @ h_s)
    W_a = torch.cat([m.concat.query_proj.weight, m.concat.key_proj.weight], dim=1).detach()  # (A, Dq + Dk)
    return m.concat.v.detach() @ torch.tanh(W_a @ torch.cat([h_t, h_s]))


def _reference(m, q, mem, allowed=None, step=0, lengths=None):
    """Eqs. 7-10 and 5, one (b, t) at a time."""
    D = m.window
    out_h = torch.zeros(q.shape[0], q.shape[1], m.w_c.out_features, dtype=torch.float64)
    ctx = torch.zeros(q.shape[0], q.shape[1], mem.shape[2], dtype=torch.float64)
    w = torch.zeros(q.shape[0], q.shape[1], mem.shape[1], dtype=torch.float64)
    for b in range(q.shape[0]):
        S = mem.shape[1] if lengths is None else float(lengths[b])
        for i in range(q.shape[1]):
            h_t = q[b, i]
            if m.mode == "local-m":
                p_t = float(step + i)
            elif m.mode == "local-p":  # eq. 9
                p_t = S * torch.sigmoid(m.v_p.detach() @ torch.tanh(m.w_p.weight.detach() @ h_t)).item()
            srcs = [s for s in range(mem.shape[1]) if (allowed is None or allowed[b, i, s])
                    and (m.mode == "global" or abs(s - p_t) <= D)]
            if srcs:
                e = torch.stack([_score(m, h_t, mem[b, s]) for s in srcs])
                align = torch.exp(e - e.max()) / torch.exp(e - e.max()).sum()  # eq. 7
                for a, s in zip(align, srcs, strict=True):
                    if m.mode == "local-p":  # eq. 10, sigma = D / 2
                        a = a * math.exp(-((s - p_t) ** 2) / (2 * (D / 2) ** 2))
                    w[b, i, s] = a
                    ctx[b, i] += a * mem[b, s]
            out_h[b, i] = torch.tanh(m.w_c.weight.detach() @ torch.cat([ctx[b, i], h_t]))  # eq. 5
    return out_h, ctx, w


def _check(got, ref, atol=1e-12):
    for g, r in zip(got[:3], ref, strict=True):
        torch.testing.assert_close(g, r, rtol=0, atol=atol)


@pytest.mark.parametrize("score", SCORES)
@pytest.mark.parametrize("mode", MODES)
def test_matches_paper_equations(score, mode):
    m = _module(score, mode)
    q, mem = _inputs(dk=DQ if score == "dot" else DK)
    _check(m(q, mem), _reference(m, q, mem))


def test_local_m_step_offset_and_local_p_source_lengths():
    m = _module("general", "local-m", window=1)
    q, mem = _inputs()
    out = m(q, mem, step=3)
    _check(out, _reference(m, q, mem, step=3))
    assert out.centers.tolist() == [[3.0, 4.0, 5.0, 6.0, 7.0]]
    assert (out.weights[:, 4, :6] == 0).all() and (out.weights[:, 4, 6] == 1).all()  # t = 7: window [6, 8]
    assert not (out.weights[:, 3, 5:7] == 0).any()
    m = _module("general", "local-p", window=2)
    lengths = torch.tensor([4, 7])
    out = m(q, mem, source_lengths=lengths, mask=masks.padding(lengths))
    allowed = masks.padding(lengths).materialize(LQ, LK, batch=B)[:, 0]
    _check(out, _reference(m, q, mem, allowed=allowed, lengths=lengths))
    assert (out.centers[0] <= 4).all() and (out.centers >= 0).all()


def test_local_p_weights_are_gaussian_scaled_not_renormalised():
    m = _module("dot", "local-p", window=3)
    q, mem = _inputs(dk=DQ)
    out = m(q, mem)
    assert (out.weights.sum(-1) < 1).all() and (out.weights.sum(-1) > 0).all()


def test_reduces_to_dense_attention():
    q, mem = _inputs(dk=DQ)
    m = _module("dot", "global")
    ref = attnkit.attention(q, mem, mem, score="dot", return_weights=True)
    out = m(q, mem)
    torch.testing.assert_close(out.context, ref.output, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.weights, ref.weights, rtol=0, atol=1e-12)
    q, mem = _inputs()
    m = _module("general", "global")
    ref = attnkit.attention(q @ m.w_a.detach(), mem, mem, score="dot")
    torch.testing.assert_close(m(q, mem).context, ref, rtol=0, atol=1e-12)
    m = _module("concat", "global")
    add = AdditiveAttention(DQ, DK, A).double()
    add.load_state_dict(m.concat.state_dict())
    torch.testing.assert_close(m(q, mem).context, add(q, mem).context, rtol=0, atol=1e-12)


def test_local_m_with_wide_window_is_global():
    q, mem = _inputs()
    wide, glob = _module("general", "local-m", window=LK + LQ), _module("general", "global")
    glob.load_state_dict(wide.state_dict())
    for a, b in zip(wide(q, mem)[:3], glob(q, mem)[:3], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-14)


@pytest.mark.parametrize("score,mode", [("dot", "local-m"), ("general", "local-p"), ("concat", "global")])
def test_gradcheck(score, mode):
    m = _module(score, mode, window=1)
    q, mem = _inputs(dk=DQ if score == "dot" else DK)
    q, mem = q[:, :3].clone().requires_grad_(True), mem[:, :4].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, b: m(a, b)[:3], (q, mem), fast_mode=True)


def test_local_p_centre_is_trained_through_the_gaussian():
    m = _module("general", "local-p", window=2)
    q, mem = _inputs()
    m(q, mem).hidden.sum().backward()
    assert m.w_p.weight.grad.abs().sum() > 0 and m.v_p.grad.abs().sum() > 0


def test_fully_masked_rows_give_zero():
    m = _module("concat", "local-p")
    q, mem = _inputs(requires_grad=True)
    mem_nan = mem.detach().clone()
    mem_nan[0] = float("nan")  # sample 0 is all padding
    out = m(q, mem_nan, mask=masks.padding(torch.tensor([0, 5])))
    assert torch.equal(out.context[0], torch.zeros(LQ, DK, dtype=torch.float64))
    assert torch.equal(out.weights[0], torch.zeros(LQ, LK, dtype=torch.float64))
    torch.testing.assert_close(out.hidden[0], torch.tanh(q[0].detach() @ m.w_c.weight[:, DK:].detach().T))
    out.hidden.sum().backward()
    assert torch.isfinite(q.grad).all() and all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_state_dict_round_trip():
    q, mem = _inputs()
    for score in ("general", "concat"):
        a, b = _module(score, "local-p", seed=0), _module(score, "local-p", seed=1)
        assert not torch.allclose(a(q, mem).hidden, b(q, mem).hidden)
        b.load_state_dict(a.state_dict())
        assert torch.equal(a(q, mem).hidden, b(q, mem).hidden)
    keys = set(_module("concat", "local-p").state_dict())
    assert keys == {"concat.query_proj.weight", "concat.key_proj.weight", "concat.v", "w_p.weight", "v_p",
                    "w_c.weight"}


def test_errors():
    with pytest.raises(ArgumentError, match="dot"):
        LuongAttention(DQ, DK, score="dot")
    with pytest.raises(ArgumentError, match="mode"):
        LuongAttention(DQ, mode="local")
    with pytest.raises(ArgumentError, match="window"):
        LuongAttention(DQ, mode="local-p", window=0)
    m = _module("general", "local-p")
    q, mem = _inputs()
    with pytest.raises(ShapeError, match="memory"):
        m(q, mem[..., :2])
    with pytest.raises(ShapeError, match="source_lengths"):
        m(q, mem, source_lengths=torch.tensor([3]))
    with pytest.raises(ArgumentError, match="step"):
        m(q, mem, step=-1)
