"""CoverageAttention (See et al. 2017) against a float64 loop transcription of eqs. 10-12."""

from __future__ import annotations

import pytest
import torch

from attnkit import masks
from attnkit.errors import ShapeError
from attnkit.nn.additive import AdditiveAttention
from attnkit.nn.coverage import CoverageAttention, coverage_loss
from tests.nn.additive_reference import DK, DQ, DV, LK, LQ, A, B, inputs


def _module(seed=0, **kwargs):
    torch.manual_seed(seed)
    m = CoverageAttention(DQ, DK, A, **kwargs).double()
    with torch.no_grad():
        m.w_c.mul_(3.0)  # make the coverage term matter
    return m


def _reference(m, s, h, v, c0=None, allowed=None):
    """c^t = sum_{t'<t} a^{t'} (10); e_i^t = v.tanh(W_h h_i + W_s s_t + w_c c_i^t + b) (11); sum_i min(a, c) (12)."""
    Wh, Ws, b = m.w_h.weight.detach(), m.w_s.weight.detach(), m.w_s.bias.detach()
    wc, va = m.w_c.detach(), m.v.detach()
    ctx = torch.zeros(s.shape[0], s.shape[1], v.shape[2], dtype=torch.float64)
    w = torch.zeros(s.shape[0], s.shape[1], h.shape[1], dtype=torch.float64)
    loss = torch.zeros(s.shape[0], s.shape[1], dtype=torch.float64)
    cov = torch.zeros(s.shape[0], h.shape[1], dtype=torch.float64) if c0 is None else c0.clone()
    for bi in range(s.shape[0]):
        for t in range(s.shape[1]):
            keys = [i for i in range(h.shape[1]) if allowed is None or allowed[bi, t, i]]
            if keys:
                e = torch.stack([va @ torch.tanh(Wh @ h[bi, i] + Ws @ s[bi, t] + wc * cov[bi, i] + b) for i in keys])
                a = torch.exp(e - e.max()) / torch.exp(e - e.max()).sum()
                for ai, i in zip(a, keys, strict=True):
                    w[bi, t, i] = ai
                    ctx[bi, t] += ai * v[bi, i]
            loss[bi, t] = sum(min(w[bi, t, i].item(), cov[bi, i].item()) for i in range(h.shape[1]))
            cov[bi] = cov[bi] + w[bi, t]
    return ctx, w, cov, loss


def _check(got, ref, atol=1e-12):
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g, r, rtol=0, atol=atol)


def test_matches_paper_equations():
    m = _module()
    s, h, v = inputs()
    out = m(s, h, v)
    _check(out, _reference(m, s, h, v))
    assert (out.loss[:, 0] == 0).all() and (out.loss[:, 1:] > 0).all()
    torch.testing.assert_close(out.coverage.sum(-1), torch.full((B,), float(LQ), dtype=torch.float64))


def test_initial_coverage_and_step_by_step_equal_one_call():
    m = _module()
    s, h, v = inputs()
    c0 = torch.rand(B, LK, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    whole = m(s, h, v, c0)
    _check(whole, _reference(m, s, h, v, c0=c0))
    cov, parts = c0, []
    for t in range(LQ):
        out = m(s[:, t:t + 1], h, v, cov)
        cov = out.coverage
        parts.append(out)
    torch.testing.assert_close(torch.cat([p.context for p in parts], 1), whole.context, rtol=0, atol=1e-14)
    torch.testing.assert_close(torch.cat([p.loss for p in parts], 1), whole.loss, rtol=0, atol=1e-14)
    torch.testing.assert_close(cov, whole.coverage, rtol=0, atol=1e-14)


def test_without_coverage_weight_is_additive_attention():
    """With w_c = 0 eq. 11 is Bahdanau's score with a bias: the dense additive module."""
    m = _module()
    with torch.no_grad():
        m.w_c.zero_()
    add = AdditiveAttention(DQ, DK, A, bias=True).double()
    add.load_state_dict({"query_proj.weight": m.w_s.weight, "query_proj.bias": m.w_s.bias,
                         "key_proj.weight": m.w_h.weight, "v": m.v})
    s, h, v = inputs()
    out, ref = m(s, h, v), add(s, h, v)
    torch.testing.assert_close(out.context, ref.context, rtol=0, atol=1e-14)
    torch.testing.assert_close(out.weights, ref.weights, rtol=0, atol=1e-14)


def test_coverage_loss_function():
    a = torch.tensor([[0.5, 0.2, 0.3]])
    c = torch.tensor([[0.1, 0.9, 0.0]])
    assert coverage_loss(a, c).tolist() == pytest.approx([0.1 + 0.2 + 0.0])


def test_masks_and_fully_masked_rows():
    m = _module()
    s, h, v = inputs()
    s.requires_grad_(True)
    mask = masks.padding(torch.tensor([0, 4]))
    h_bad, v_bad = h.clone(), v.clone()
    h_bad[:, 4:], v_bad[:, 4:] = float("nan"), float("inf")
    out = m(s, h_bad, v_bad, mask=mask)
    allowed = mask.materialize(LQ, LK, batch=B)[:, 0]
    _check(out, _reference(m, s.detach(), h, v, allowed=allowed))
    assert torch.equal(out.context[0], torch.zeros(LQ, DV, dtype=torch.float64))
    assert torch.equal(out.coverage[0], torch.zeros(LK, dtype=torch.float64))
    assert torch.equal(out.coverage[1, 4:], torch.zeros(3, dtype=torch.float64))
    (out.context.sum() + out.loss.sum()).backward()
    assert torch.isfinite(s.grad).all() and all(torch.isfinite(p.grad).all() for p in m.parameters())
    causal = m(s.detach(), h, v, mask=masks.causal(align="top_left"))
    tri = masks.causal(align="top_left").materialize(LQ, LK)[:, 0].expand(B, LQ, LK)
    _check(causal, _reference(m, s.detach(), h, v, allowed=tri))


def test_gradcheck():
    m = _module()
    s, h, v = inputs()
    c0 = torch.rand(B, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    args = (s[:, :3].clone(), h[:, :4].clone(), v[:, :4].clone(), c0)
    args = tuple(t.requires_grad_(True) for t in args)
    assert torch.autograd.gradcheck(lambda *t: tuple(m(*t)), args)


def test_state_dict_round_trip():
    a, b = _module(0), _module(1)
    s, h, v = inputs()
    assert not torch.allclose(a(s, h, v).context, b(s, h, v).context)
    b.load_state_dict(a.state_dict())
    assert set(a.state_dict()) == {"w_h.weight", "w_s.weight", "w_s.bias", "w_c", "v"}
    for x, y in zip(a(s, h, v), b(s, h, v), strict=True):
        assert torch.equal(x, y)


def test_empty_steps_and_errors():
    m = _module()
    s, h, v = inputs()
    out = m(s[:, :0], h, v)
    assert out.context.shape == (B, 0, DV) and out.loss.shape == (B, 0)
    assert torch.equal(out.coverage, torch.zeros(B, LK, dtype=torch.float64))
    with pytest.raises(ShapeError, match="coverage"):
        m(s, h, v, torch.zeros(B, LK + 1, dtype=torch.float64))
    with pytest.raises(ShapeError, match="query"):
        m(s[0], h, v)


def test_mismatched_memory_raises_attnkit_errors():
    import attnkit
    from attnkit.nn import AdditiveAttention, CoverageAttention, HardAttention, LuongAttention
    q = torch.randn(2, 3, 4)
    for module in (AdditiveAttention(4, 5), CoverageAttention(4, 5), HardAttention(4, 5)):
        with pytest.raises(attnkit.ShapeError, match="batch size"):
            module(q, torch.randn(3, 7, 5))
        with pytest.raises(attnkit.ShapeError, match="value must have shape"):
            module(q, torch.randn(2, 7, 5), torch.randn(2, 6, 5))
    with pytest.raises(attnkit.ShapeError, match="memory"):
        LuongAttention(4, 5)(q, torch.randn(3, 7, 5))
    with pytest.raises(attnkit.DTypeError, match="coverage must be a tensor"):
        CoverageAttention(4, 5)(q, torch.randn(2, 7, 5), None, [0.0] * 7)
