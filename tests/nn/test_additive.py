"""AdditiveAttention (Bahdanau et al. 2015) against a float64 loop transcription of eq. 6 / A.1.2."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.errors import ArgumentError, ShapeError
from attnkit.nn.additive import AdditiveAttention, additive_scores
from tests.nn.additive_reference import DK, DQ, DV, LK, LQ, A, B, inputs


def _module(seed=0, **kwargs):
    torch.manual_seed(seed)
    return AdditiveAttention(DQ, DK, A, **kwargs).double()


def _reference(m, q, k, v, allowed=None):
    """e_ij = v_a . tanh(W_a s_i + b + U_a h_j); alpha = softmax over allowed j; c_i = sum_j alpha_ij v_j."""
    W, U, va = m.query_proj.weight.detach(), m.key_proj.weight.detach(), m.v.detach()
    bq = m.query_proj.bias.detach() if m.query_proj.bias is not None else torch.zeros(A, dtype=torch.float64)
    ctx = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64)
    w = torch.zeros(q.shape[0], q.shape[1], k.shape[1], dtype=torch.float64)
    for b in range(q.shape[0]):
        for i in range(q.shape[1]):
            keys = [j for j in range(k.shape[1]) if allowed is None or allowed[b, i, j]]
            if not keys:
                continue
            e = torch.stack([va @ torch.tanh(W @ q[b, i] + bq + U @ k[b, j]) for j in keys])
            alpha = torch.exp(e - e.max()) / torch.exp(e - e.max()).sum()
            for a, j in zip(alpha, keys, strict=True):
                w[b, i, j] = a
                ctx[b, i] += a * v[b, j]
    return ctx, w


@pytest.mark.parametrize("bias", [False, True])
def test_matches_paper_equations(bias):
    m = _module(bias=bias)
    q, k, v = inputs()
    ctx, w = m(q, k, v)
    ref_ctx, ref_w = _reference(m, q, k, v)
    torch.testing.assert_close(ctx, ref_ctx, rtol=0, atol=1e-12)
    torch.testing.assert_close(w, ref_w, rtol=0, atol=1e-12)


def test_value_defaults_to_key_and_float32_close():
    m = _module()
    q, k, _ = inputs()
    ref_ctx, ref_w = _reference(m, q, k, k)
    ctx, w = m.float()(q.float(), k.float())
    assert ctx.dtype == torch.float32 and ctx.shape == (B, LQ, DK)
    torch.testing.assert_close(ctx.double(), ref_ctx, rtol=0, atol=1e-5)
    torch.testing.assert_close(w.double(), ref_w, rtol=0, atol=1e-5)


def test_masks_and_fully_masked_rows():
    m = _module()
    q, k, v = inputs(requires_grad=True)
    mask = masks.padding(torch.tensor([0, 4])) & masks.causal(align="top_left")
    allowed = mask.materialize(LQ, LK, batch=B)[:, 0]
    v_nan = v.detach().clone()
    v_nan[1, 4:] = float("nan")  # past sample 1's length: must not leak
    k_nan = k.detach().clone()
    k_nan[1, 4:] = float("inf")
    ctx, w = m(q, k_nan, v_nan, mask=mask)
    ref_ctx, ref_w = _reference(m, q.detach(), k.detach(), v.detach(), allowed)
    torch.testing.assert_close(ctx, ref_ctx, rtol=0, atol=1e-12)
    torch.testing.assert_close(w, ref_w, rtol=0, atol=1e-12)
    assert torch.equal(ctx[0], torch.zeros(LQ, DV, dtype=torch.float64))
    assert torch.equal(w[0], torch.zeros(LQ, LK, dtype=torch.float64))
    ctx.sum().backward()
    assert torch.isfinite(q.grad).all() and torch.equal(q.grad[0], torch.zeros(LQ, DQ, dtype=torch.float64))
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_bool_tensor_mask_equals_mask_object():
    m = _module()
    q, k, v = inputs()
    keep = torch.rand(B, LQ, LK, generator=torch.Generator().manual_seed(3)) > 0.4
    ctx, w = m(q, k, v, mask=keep)
    ref_ctx, ref_w = _reference(m, q, k, v, keep)
    torch.testing.assert_close(ctx, ref_ctx, rtol=0, atol=1e-12)
    torch.testing.assert_close(w, ref_w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("max_elements", [1 << 22, 5])
def test_gradcheck(max_elements):
    m = _module(bias=True, max_elements=max_elements)
    q, k, v = inputs()
    q, k, v = (t[:, :n].clone().requires_grad_(True) for t, n in ((q, 3), (k, 4), (v, 4)))
    assert torch.autograd.gradcheck(lambda *t: m(*t), (q, k, v), fast_mode=max_elements < 100)


@pytest.mark.parametrize("max_elements", [1, 7, 40, 200])
def test_tiled_path_equals_one_piece(max_elements):
    q, k, v = inputs()
    whole, tiled = _module(), _module(max_elements=max_elements)
    tiled.load_state_dict(whole.state_dict())
    outs = []
    for m in (whole, tiled):
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        ctx, w = m(qq, kk, vv)
        (ctx.square().sum() + w[..., 1:].sum()).backward()
        outs.append([ctx, w, qq.grad, kk.grad, vv.grad] + [p.grad for p in m.parameters()])
    for a, b in zip(*outs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


def test_tiles_bound_the_saved_hidden_tensor():
    """With a small budget no (B, Lq, Lk, A) hidden tensor is kept for backward; without one it is."""
    q, k, v = inputs(requires_grad=True)

    def largest_saved(m):
        sizes = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
            m(q, k, v)
        return max(sizes)

    hidden = B * LQ * LK * A
    assert largest_saved(_module()) >= hidden
    assert largest_saved(_module(max_elements=8)) < hidden


def test_scores_blockwise_in_chunked_kernel():
    """additive_scores is pairwise, so the online-softmax kernel (key blocks) gives the same answer."""
    m = _module()
    q, k, v = inputs()
    pq, pk = m.query_proj(q).detach(), m.key_proj(k).detach()
    fn = lambda a, b: additive_scores(a, b, m.v.detach(), max_elements=3)
    mask = masks.padding(torch.tensor([7, 3]))
    ref = attnkit.attention(pq, pk, v, score=fn, scale=1.0, mask=mask, backend="reference")
    got = attnkit.attention(pq, pk, v, score=fn, scale=1.0, mask=mask, backend="chunked")
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    no_weights = m(q, k, v, mask=mask, need_weights=False)
    assert no_weights.weights is None
    torch.testing.assert_close(no_weights.context, ref, rtol=0, atol=1e-12)


def test_state_dict_round_trip():
    a, b = _module(seed=0, bias=True), _module(seed=1, bias=True)
    q, k, v = inputs()
    assert not torch.allclose(a(q, k, v).context, b(q, k, v).context)
    b.load_state_dict(a.state_dict())
    assert set(a.state_dict()) == {"query_proj.weight", "query_proj.bias", "key_proj.weight", "v"}
    assert torch.equal(a(q, k, v).context, b(q, k, v).context)


def test_dropout_only_in_training():
    m = _module(dropout=0.5)
    plain = _module()
    q, k, v = inputs()
    m.eval()
    assert torch.equal(m(q, k, v).context, plain(q, k, v).context)
    m.train()
    torch.manual_seed(0)
    assert not torch.allclose(m(q, k, v).context, plain(q, k, v).context)


def test_errors():
    m = _module()
    q, k, v = inputs()
    with pytest.raises(ShapeError, match="query"):
        m(q[..., :5], k, v)
    with pytest.raises(ShapeError, match="key"):
        m(q, k[0], v)
    with pytest.raises(TypeError, match="bool"):
        m(q, k, v, mask=torch.ones(B, LQ, LK))
    with pytest.raises(ArgumentError):
        AdditiveAttention(DQ, dropout=1.0)
