"""HardAttention (Xu et al. 2015): soft, stochastic (REINFORCE), argmax and Gumbel-softmax modes."""

from __future__ import annotations

import pytest
import torch

from attnkit import masks
from attnkit.errors import ArgumentError
from attnkit.nn.hard import HardAttention
from tests.nn.additive_reference import DK, DQ, DV, LK, LQ, A, B, inputs

MODES = ("soft", "stochastic", "argmax", "gumbel")


def _module(seed=0, **kwargs):
    torch.manual_seed(seed)
    m = HardAttention(DQ, DK, A, **kwargs).double()
    with torch.no_grad():
        m.f_att.v.mul_(4.0)  # spread the probabilities so a wrong sampler is easy to tell apart
    return m


def _gen(seed=7):
    return torch.Generator().manual_seed(seed)


def _ref_scores(m, h, a):
    """e_ti = f_att(a_i, h_t) = w . tanh(W h_t + U a_i), one (b, t, i) at a time."""
    W, U, w = (p.detach() for p in (m.f_att.query_proj.weight, m.f_att.key_proj.weight, m.f_att.v))
    e = torch.zeros(h.shape[0], h.shape[1], a.shape[1], dtype=torch.float64)
    for b in range(h.shape[0]):
        for t in range(h.shape[1]):
            for i in range(a.shape[1]):
                e[b, t, i] = w @ torch.tanh(W @ h[b, t] + U @ a[b, i])
    return e


def _chi_square(counts, probs):
    expected = probs * counts.sum()
    return (((counts - expected) ** 2) / expected).sum().item()


def test_soft_matches_paper_and_additive_module():
    m = _module()
    h, a, v = inputs()
    alpha = torch.softmax(_ref_scores(m, h, a), -1)
    out = m(h, a, v)
    torch.testing.assert_close(out.weights, alpha, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.probs, alpha, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.context, alpha @ v, rtol=0, atol=1e-12)  # z_t = sum_i alpha_ti a_i
    assert out.log_prob is None
    torch.testing.assert_close(out.context, m.f_att(h, a, v).context, rtol=0, atol=1e-14)


def test_stochastic_samples_one_location_with_its_log_prob():
    m = _module(mode="stochastic")
    h, a, v = inputs()
    out = m(h, a, v, generator=_gen())
    alpha = torch.softmax(_ref_scores(m, h, a), -1)
    idx = out.weights.argmax(-1)
    assert torch.equal(out.weights.sum(-1), torch.ones(B, LQ, dtype=torch.float64))
    assert torch.equal(out.weights, torch.nn.functional.one_hot(idx, LK).double())
    torch.testing.assert_close(out.context, torch.stack([v[b, idx[b]] for b in range(B)]), rtol=0, atol=0)
    torch.testing.assert_close(out.log_prob, alpha.gather(-1, idx[..., None]).squeeze(-1).log(), rtol=0, atol=1e-12)
    again = m(h, a, v, generator=_gen())
    assert torch.equal(again.weights, out.weights)  # the explicit generator makes it reproducible


@pytest.mark.parametrize("mode", ["stochastic", "gumbel"])
def test_sampled_locations_follow_the_soft_weights(mode):
    """Chi-square goodness of fit of 6000 draws against alpha (fixed seed; 0.1% critical values)."""
    m = _module(mode=mode, straight_through=True)
    h, a, _ = inputs()
    n = 6000
    query = h[:1, :1].expand(1, n, DQ)
    keep = torch.tensor([True, True, False, True, True, True, False])
    out = m(query, a[:1], mask=keep, generator=_gen(3))
    counts = out.weights[0].sum(0)
    probs = out.probs[0, 0]
    assert counts.sum() == n and (counts[~keep] == 0).all()
    assert probs.max() > 3 * probs[keep].min()  # alpha is far from uniform: a uniform sampler would fail
    assert _chi_square(counts[keep], probs[keep]) < 18.47  # df = 4
    uniform = torch.full((5,), 1 / 5, dtype=torch.float64)
    assert _chi_square(counts[keep], uniform) > 18.47  # and the test can tell


def test_reinforce_gradients_flow_and_are_unbiased():
    m = _module(mode="stochastic")
    h, a, v = inputs()
    reward = torch.randn(B, LQ, dtype=torch.float64)
    out = m(h, a, v, generator=_gen())
    (-(reward * out.log_prob).sum()).backward()
    for p in m.parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0
    m.zero_grad()
    v = v.clone().requires_grad_(True)
    out = m(h, a, v, generator=_gen())
    out.context.sum().backward()  # the sample itself carries no gradient to f_att
    assert all(p.grad is None or not p.grad.any() for p in m.parameters())
    # E[r(s) grad log p(s)] = grad E[r(s)]: REINFORCE with 20000 draws against the exact gradient
    r = torch.linspace(-1, 2, LK, dtype=torch.float64)
    n = 20000
    query = h[:1, :1].expand(1, n, DQ)
    m.zero_grad()
    out = m(query, a[:1], generator=_gen(11))
    ((r[out.weights[0].argmax(-1)] * out.log_prob[0]).sum() / n).backward()
    estimate = m.f_att.v.grad.clone()
    m.zero_grad()
    (m(h[:1, :1], a[:1]).probs[0, 0] @ r).backward()
    exact = m.f_att.v.grad
    assert (estimate - exact).norm() < 0.15 * exact.norm()


def test_argmax_forward_and_gradients():
    h, a, v = inputs()
    hard, st, soft = _module(mode="argmax"), _module(mode="argmax", straight_through=True), _module()
    idx = _ref_scores(hard, h, a).argmax(-1)
    v = v.clone().requires_grad_(True)
    out = hard(h, a, v)
    assert torch.equal(out.weights, torch.nn.functional.one_hot(idx, LK).double())
    torch.testing.assert_close(out.context, torch.stack([v[b, idx[b]] for b in range(B)]), rtol=0, atol=0)
    out.context.sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in hard.parameters())  # documented: zero gradient
    assert v.grad.abs().sum() > 0  # the selected value rows still learn
    v = v.detach()
    R = torch.randn(B, LQ, LK, dtype=torch.float64)
    (st(h, a, v).weights * R).sum().backward()
    (soft(h, a, v).weights * R).sum().backward()
    for p, q in zip(st.parameters(), soft.parameters(), strict=True):  # straight-through = softmax's gradient
        assert p.grad.abs().sum() > 0
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("tau", [0.5, 2.0])
def test_gumbel_relaxation_matches_reference(tau):
    m = _module(mode="gumbel", tau=tau)
    h, a, v = inputs()
    out = m(h, a, v, generator=_gen(5))
    u = torch.rand(B, LQ, LK, generator=_gen(5), dtype=torch.float64)
    y = torch.softmax((_ref_scores(m, h, a) - torch.log(-torch.log(u))) / tau, -1)  # g = -log(-log u)
    torch.testing.assert_close(out.weights, y, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.context, y @ v, rtol=0, atol=1e-12)
    hard = _module(mode="gumbel", tau=tau, straight_through=True)(h, a, v, generator=_gen(5))
    assert torch.equal(hard.weights, torch.nn.functional.one_hot(y.argmax(-1), LK).double())


@pytest.mark.parametrize("mode", ["soft", "gumbel", "stochastic"])
def test_gradcheck(mode):
    m = _module(mode=mode)
    h, a, v = inputs()
    args = tuple(t.clone().requires_grad_(True) for t in (h[:, :3], a[:, :4], v[:, :4]))
    pick = (lambda o: o.log_prob) if mode == "stochastic" else (lambda o: (o.context, o.weights))
    assert torch.autograd.gradcheck(lambda *t: pick(m(*t, generator=_gen(2))), args, fast_mode=True)


@pytest.mark.parametrize("mode", MODES)
def test_fully_masked_rows_give_zero(mode):
    m = _module(mode=mode, straight_through=True)
    h, a, v = inputs()
    h.requires_grad_(True)
    a_bad, v_bad = a.clone(), v.clone()
    a_bad[0], v_bad[0], a_bad[1, 3:] = float("nan"), float("inf"), float("nan")
    out = m(h, a_bad, v_bad, mask=masks.padding(torch.tensor([0, 3])), generator=_gen())
    assert torch.equal(out.context[0], torch.zeros(LQ, DV, dtype=torch.float64))
    assert torch.equal(out.weights[0], torch.zeros(LQ, LK, dtype=torch.float64))
    assert (out.weights[1, :, 3:] == 0).all() and torch.isfinite(out.context).all()
    loss = out.context.sum() + (out.log_prob.sum() if out.log_prob is not None else 0)
    loss.backward()
    if out.log_prob is not None:
        assert torch.equal(out.log_prob[0], torch.zeros(LQ, dtype=torch.float64))
    assert torch.isfinite(h.grad).all() and all(p.grad is None or torch.isfinite(p.grad).all() for p in m.parameters())


def test_state_dict_round_trip():
    a_mod, b_mod = _module(0, mode="stochastic"), _module(1, mode="stochastic")
    h, a, v = inputs()
    assert not torch.allclose(a_mod(h, a, v).probs, b_mod(h, a, v).probs)
    b_mod.load_state_dict(a_mod.state_dict())
    assert set(a_mod.state_dict()) == {"f_att.query_proj.weight", "f_att.key_proj.weight", "f_att.v"}
    x, y = a_mod(h, a, v, generator=_gen()), b_mod(h, a, v, generator=_gen())
    assert torch.equal(x.weights, y.weights) and torch.equal(x.log_prob, y.log_prob)


def test_errors():
    with pytest.raises(ArgumentError, match="mode"):
        HardAttention(DQ, mode="sample")
    with pytest.raises(ArgumentError, match="tau"):
        HardAttention(DQ, mode="gumbel", tau=0.0)
