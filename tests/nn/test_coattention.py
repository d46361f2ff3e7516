"""CoAttention against float64 loop transcriptions of Lu et al. 2016, eqs. 3-6 (column-vector form)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import gradcheck

from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.nn.coattention import CoAttention
from attnkit.registry import get

B, T, N, DQ, DV, K = 2, 5, 7, 3, 4, 6


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _p(t):
    return t.detach().double()


def _softmax(scores):
    top = max(scores)
    e = [math.exp(s - top) for s in scores]
    return [x / sum(e) for x in e]


def _matvec(w, x):
    """W x for W (k, d) and a column x (d,), as a list."""
    return [sum(float(w[a, c]) * float(x[c]) for c in range(len(x))) for a in range(w.shape[0])]


def ref_parallel(co, qs, vs):
    """qs (T', Dq) and vs (N', Dv) hold the real words/regions only (the paper's columns q_t, v_n)."""
    wb, wq, wv = _p(co.affinity), _p(co.question_proj.weight), _p(co.image_proj.weight)
    whq, whv = _p(co.question_score), _p(co.image_score)
    t_len, n_len = qs.shape[0], vs.shape[0]
    c = [[math.tanh(sum(float(qs[t, i]) * float(wb[i, j]) * float(vs[n, j])
                        for i in range(qs.shape[1]) for j in range(vs.shape[1]))) for n in range(n_len)]
         for t in range(t_len)]
    wq_q = [_matvec(wq, qs[t]) for t in range(t_len)]  # columns of W_q Q
    wv_v = [_matvec(wv, vs[n]) for n in range(n_len)]  # columns of W_v V
    k = wq.shape[0]
    h_v = [[math.tanh(wv_v[n][a] + sum(wq_q[t][a] * c[t][n] for t in range(t_len))) for a in range(k)]
           for n in range(n_len)]
    h_q = [[math.tanh(wq_q[t][a] + sum(wv_v[n][a] * c[t][n] for n in range(n_len))) for a in range(k)]
           for t in range(t_len)]
    a_v = _softmax([sum(float(whv[a]) * h_v[n][a] for a in range(k)) for n in range(n_len)]) if n_len else []
    a_q = _softmax([sum(float(whq[a]) * h_q[t][a] for a in range(k)) for t in range(t_len)]) if t_len else []
    v_hat = sum((a_v[n] * vs[n] for n in range(n_len)), torch.zeros(vs.shape[1], dtype=torch.float64))
    q_hat = sum((a_q[t] * qs[t] for t in range(t_len)), torch.zeros(qs.shape[1], dtype=torch.float64))
    return q_hat, v_hat, a_q, a_v


def ref_attend(wx, wg, whx, xs, g):
    """Eq. 6: H = tanh(W_x X + (W_g g) 1^T), a = softmax(w_hx^T H), x_hat = sum_i a_i x_i (g None means g = 0)."""
    wx, whx = _p(wx), _p(whx)
    bias = _matvec(_p(wg), g) if g is not None else [0.0] * wx.shape[0]
    hs = [[math.tanh(u + b) for u, b in zip(_matvec(wx, xs[i]), bias, strict=True)] for i in range(xs.shape[0])]
    if not hs:
        return torch.zeros(xs.shape[1], dtype=torch.float64), []
    a = _softmax([sum(float(whx[j]) * h[j] for j in range(len(h))) for h in hs])
    return sum(a[i] * xs[i] for i in range(len(a))), a


def ref_alternating(co, qs, vs):
    s, _ = ref_attend(co.step1_x.weight, None, co.step1_score, qs, None)
    v_hat, a_v = ref_attend(co.step2_x.weight, co.step2_g.weight, co.step2_score, vs, s)
    q_hat, a_q = ref_attend(co.step3_x.weight, co.step3_g.weight, co.step3_score, qs, v_hat)
    return q_hat, v_hat, a_q, a_v


REFS = {"parallel": ref_parallel, "alternating": ref_alternating}
Q_LEN, V_LEN = [5, 2], [7, 4]


def _inputs():
    q, v = _randn(B, T, DQ), _randn(B, N, DV, seed=1)
    return q, v, torch.arange(T) < torch.tensor(Q_LEN)[:, None], torch.arange(N) < torch.tensor(V_LEN)[:, None]


@pytest.mark.parametrize("mode", ["parallel", "alternating"])
def test_matches_equations_with_masks(mode):
    torch.manual_seed(0)
    co = CoAttention(DQ, DV, K, mode=mode).double()
    q, v, q_keep, v_keep = _inputs()
    out = co(q, v, question_mask=q_keep, image_mask=v_keep)
    for b in range(B):
        q_hat, v_hat, a_q, a_v = REFS[mode](co, q[b, :Q_LEN[b]], v[b, :V_LEN[b]])
        torch.testing.assert_close(out.question[b], q_hat, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(out.image[b], v_hat, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(out.question_weights[b, :Q_LEN[b]], torch.tensor(a_q, dtype=torch.float64))
        torch.testing.assert_close(out.image_weights[b, :V_LEN[b]], torch.tensor(a_v, dtype=torch.float64))
        assert not out.question_weights[b, Q_LEN[b]:].any() and not out.image_weights[b, V_LEN[b]:].any()


@pytest.mark.parametrize("mode", ["parallel", "alternating"])
def test_padding_cannot_leak(mode):
    co = CoAttention(DQ, DV, K, mode=mode).double()
    q, v, q_keep, v_keep = _inputs()
    clean = co(q, v, question_mask=q_keep, image_mask=v_keep)
    dirty = co(q.masked_fill(~q_keep[..., None], float("nan")), v.masked_fill(~v_keep[..., None], float("inf")),
               question_mask=q_keep, image_mask=v_keep)
    for a, b in zip(clean, dirty, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("mode", ["parallel", "alternating"])
def test_empty_question_gives_zero_and_finite_grads(mode):
    co = CoAttention(DQ, DV, K, mode=mode).double()
    q, v = _randn(B, T, DQ).requires_grad_(), _randn(B, N, DV, seed=1).requires_grad_()
    q_keep = torch.ones(B, T, dtype=torch.bool)
    q_keep[1] = False
    out = co(q, v, question_mask=q_keep)
    assert torch.equal(out.question[1], torch.zeros(DQ, dtype=torch.float64)) and not out.question_weights[1].any()
    _, v_hat, _, _ = REFS[mode](co, q[1, :0].detach(), v[1].detach())
    torch.testing.assert_close(out.image[1], v_hat, rtol=1e-10, atol=1e-12)
    (out.question.sum() + out.image.sum()).backward()
    assert torch.isfinite(q.grad).all() and not q.grad[1].any() and torch.isfinite(v.grad).all()


def test_parallel_is_symmetric_under_swapping_modalities():
    """Swapping Q and V (with W_b -> W_b^T and the two projections/scores) swaps the outputs: the paper's symmetry."""
    co = CoAttention(DQ, DV, K).double()
    swapped = CoAttention(DV, DQ, K).double()
    with torch.no_grad():
        swapped.affinity.copy_(co.affinity.T)
        swapped.question_proj.weight.copy_(co.image_proj.weight)
        swapped.image_proj.weight.copy_(co.question_proj.weight)
        swapped.question_score.copy_(co.image_score)
        swapped.image_score.copy_(co.question_score)
    q, v, _, _ = _inputs()
    a, b = co(q, v), swapped(v, q)
    torch.testing.assert_close(a.question, b.image, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(a.image_weights, b.question_weights, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("mode", ["parallel", "alternating"])
def test_float32_close_to_float64(mode):
    torch.manual_seed(0)
    co = CoAttention(DQ, DV, K, mode=mode)
    q, v, q_keep, v_keep = _inputs()
    got = co(q.float(), v.float(), question_mask=q_keep, image_mask=v_keep)
    ref = co.double()(q, v, question_mask=q_keep, image_mask=v_keep)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["parallel", "alternating"])
def test_gradcheck(mode):
    co = CoAttention(2, 3, 4, mode=mode).double()
    q, v = _randn(2, 3, 2).requires_grad_(), _randn(2, 4, 3, seed=1).requires_grad_()
    q_keep = torch.tensor([[True, True, False], [True, True, True]])
    v_keep = torch.tensor([[True, True, True, True], [True, False, True, False]])

    def f(q, v):
        out = co(q, v, question_mask=q_keep, image_mask=v_keep)
        return out.question, out.image

    assert gradcheck(f, (q, v))


@pytest.mark.parametrize("mode", ["parallel", "alternating"])
def test_state_dict_round_trip(mode):
    torch.manual_seed(0)
    a = CoAttention(DQ, DV, K, mode=mode).double()
    torch.manual_seed(1)
    b = CoAttention(DQ, DV, K, mode=mode).double()
    q, v, _, _ = _inputs()
    assert not torch.allclose(a(q, v).image, b(q, v).image)
    b.load_state_dict(a.state_dict())
    for x, y in zip(a(q, v), b(q, v), strict=True):
        assert torch.equal(x, y)


def test_bad_inputs():
    co = CoAttention(DQ, DV, K)
    with pytest.raises(ShapeError, match=r"question must have shape \(batch, length, 3\)"):
        co(torch.randn(B, T, DV), torch.randn(B, N, DV))
    with pytest.raises(ShapeError, match=r"image must have shape \(batch=2, length, 4\)"):
        co(torch.randn(B, T, DQ), torch.randn(3, N, DV))
    with pytest.raises(DTypeError, match="image_mask must be a bool"):
        co(torch.randn(B, T, DQ), torch.randn(B, N, DV), image_mask=torch.ones(B, N))
    with pytest.raises(ShapeError, match=r"question_mask must have shape \(2, 5\)"):
        co(torch.randn(B, T, DQ), torch.randn(B, N, DV), question_mask=torch.ones(B, N, dtype=torch.bool))
    with pytest.raises(ArgumentError, match="mode must be"):
        CoAttention(DQ, DV, K, mode="sequential")


def test_registry_examples_run():
    for name in ("co-attention-parallel", "co-attention-alternating"):
        module, inputs = get(name).example()
        out = module(*inputs)
        assert out.question.shape == (2, 6) and out.image_weights.shape == (2, 9)
