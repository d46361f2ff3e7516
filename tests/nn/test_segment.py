"""SegmentAttention and TieredAttention against float64 loop transcriptions of their equations."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.autograd import gradcheck

import attnkit
from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.nn.segment import SegmentAttention, TieredAttention
from attnkit.registry import get

B, LQ, N, D, DQ = 2, 3, 7, 5, 4
IDS = torch.tensor([[0, 0, 1, 1, 1, 2, 3], [2, 2, 0, 1, 1, 1, 0]])


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _mat(linear):
    return linear.weight.detach().double()


def _softmax(scores):
    top = max(scores.values())
    e = {key: math.exp(s - top) for key, s in scores.items()}
    return {key: x / sum(e.values()) for key, x in e.items()}


def ref_segment(attn, query, x, ids, keep, num):
    """g_s = sum_{t in s} beta_t x_t; alpha = softmax_s(W_q q . W_k g_s / sqrt(D)); out = sum_s alpha_s W_v g_s."""
    wq, wk, wv = _mat(attn.q_proj), _mat(attn.k_proj), _mat(attn.v_proj)
    lq, n = query.shape[0], x.shape[0]
    out = torch.zeros(lq, wv.shape[0], dtype=torch.float64)
    seg_w, tok_w = torch.zeros(lq, num, dtype=torch.float64), torch.zeros(lq, n, dtype=torch.float64)
    beta, pooled = {}, {}
    for s in range(num):
        tokens = [t for t in range(n) if int(ids[t]) == s and keep[t]]
        if not tokens:
            continue
        if attn.pooler is None:
            share = {t: 1.0 / len(tokens) for t in tokens}
        else:
            p, c = attn.pooler.proj, attn.pooler.context.detach()
            u = {t: torch.tanh(_mat(p) @ x[t] + p.bias.detach()) for t in tokens}
            share = _softmax({t: float(u[t] @ c) for t in tokens})
        beta.update(share)
        pooled[s] = sum(share[t] * x[t] for t in tokens)
    for i in range(lq):
        if not pooled:
            continue
        alpha = _softmax({s: float((wq @ query[i]) @ (wk @ g)) / math.sqrt(wk.shape[0]) for s, g in pooled.items()})
        for s, a in alpha.items():
            seg_w[i, s] = a
            out[i] += a * (wv @ pooled[s])
        for t, share in beta.items():
            tok_w[i, t] = alpha[int(ids[t])] * share
    return out, seg_w, tok_w


def ref_tiered(attn, query, x, ids, keep, num, top_k):
    """alpha over groups (mean keys, top-k), beta within each group, weight_t = alpha_g(t) beta_t."""
    wq, wk, wv = _mat(attn.q_proj), _mat(attn.k_proj), _mat(attn.v_proj)
    lq, n, scale = query.shape[0], x.shape[0], 1.0 / math.sqrt(wk.shape[0])
    keys = [wk @ x[t] for t in range(n)]
    groups = {g: [t for t in range(n) if int(ids[t]) == g and keep[t]] for g in range(num)}
    groups = {g: ts for g, ts in groups.items() if ts}
    out = torch.zeros(lq, wv.shape[0], dtype=torch.float64)
    grp_w, tok_w = torch.zeros(lq, num, dtype=torch.float64), torch.zeros(lq, n, dtype=torch.float64)
    for i in range(lq):
        q = wq @ query[i]
        g_scores = {g: float(q @ (sum(keys[t] for t in ts) / len(ts))) * scale for g, ts in groups.items()}
        if top_k is not None:
            best = sorted(g_scores, key=lambda g: -g_scores[g])[:top_k]
            g_scores = {g: g_scores[g] for g in best}
        if not g_scores:
            continue
        alpha = _softmax(g_scores)
        for g, a in alpha.items():
            grp_w[i, g] = a
            beta = _softmax({t: float(q @ keys[t]) * scale for t in groups[g]})
            for t, b in beta.items():
                tok_w[i, t] = a * b
                out[i] += a * b * (wv @ x[t])
    return out, grp_w, tok_w


def _inputs(seed=0):
    query, x = _randn(B, LQ, DQ, seed=seed), _randn(B, N, D, seed=seed + 1)
    keep = torch.ones(B, N, dtype=torch.bool)
    keep[1, 6] = False
    keep[0, 2:4] = False
    return query, x, keep


def _check_against(got, ref):
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("pool", ["mean", "attention"])
def test_segment_matches_equations(pool):
    torch.manual_seed(0)
    attn = SegmentAttention(D, query_dim=DQ, pool=pool).double()
    query, x, keep = _inputs()
    got = attn(query, x, IDS, mask=keep, num_segments=5)  # segment 4 is empty everywhere
    assert got.segment_weights.shape == (B, LQ, 5) and not got.segment_weights[..., 4].any()
    for b in range(B):
        _check_against([t[b] for t in got], ref_segment(attn, query[b], x[b], IDS[b], keep[b], 5))
    torch.testing.assert_close(got.token_weights.sum(-1), torch.ones(B, LQ, dtype=torch.float64))


@pytest.mark.parametrize("pool", ["mean", "attention"])
def test_segment_output_is_token_weights_times_values(pool):
    attn = SegmentAttention(D, query_dim=DQ, pool=pool).double()
    query, x, keep = _inputs()
    out, _, tok_w = attn(query, x, IDS, mask=keep)
    torch.testing.assert_close(out, tok_w @ attn.v_proj(x), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("pool", ["mean", "attention"])
def test_segment_one_token_per_segment_is_flat_attention(pool):
    attn = SegmentAttention(D, query_dim=DQ, pool=pool).double()
    query, x, _ = _inputs()
    out, seg_w, tok_w = attn(query, x, torch.arange(N))
    q, k, v = attn.q_proj(query), attn.k_proj(x), attn.v_proj(x)
    flat = attnkit.attention(q, k, v)
    plain = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(D), -1)
    torch.testing.assert_close(out, flat, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(seg_w, plain, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(tok_w, plain, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("top_k", [None, 1, 2])
def test_tiered_matches_equations(top_k):
    torch.manual_seed(0)
    attn = TieredAttention(D, query_dim=DQ, top_k=top_k).double()
    query, x, keep = _inputs()
    got = attn(query, x, IDS, mask=keep)
    for b in range(B):
        _check_against([t[b] for t in got], ref_tiered(attn, query[b], x[b], IDS[b], keep[b], 4, top_k))
    torch.testing.assert_close(got.token_weights.sum(-1), torch.ones(B, LQ, dtype=torch.float64))
    if top_k is not None:
        assert ((got.segment_weights > 0).sum(-1) == top_k).all()


def test_tiered_one_group_is_flat_attention():
    attn = TieredAttention(D, query_dim=DQ).double()
    query, x, keep = _inputs()
    out, grp_w, tok_w = attn(query, x, torch.zeros(N, dtype=torch.long), mask=keep)
    q, k, v = attn.q_proj(query), attn.k_proj(x), attn.v_proj(x)
    flat = attnkit.attention(q, k, v, mask=attnkit.masks.keys(keep), return_weights=True)
    torch.testing.assert_close(out, flat.output, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(tok_w, flat.weights, rtol=1e-12, atol=1e-13)
    assert torch.equal(grp_w, torch.ones(B, LQ, 1, dtype=torch.float64))


def test_tiered_top_k_at_least_groups_is_soft_and_top_1_is_flat_inside_the_best_group():
    soft = TieredAttention(D, query_dim=DQ).double()
    wide = TieredAttention(D, query_dim=DQ, top_k=4).double()
    one = TieredAttention(D, query_dim=DQ, top_k=1).double()
    wide.load_state_dict(soft.state_dict())
    one.load_state_dict(soft.state_dict())
    query, x, keep = _inputs()
    for a, b in zip(soft(query, x, IDS, mask=keep), wide(query, x, IDS, mask=keep), strict=True):
        assert torch.equal(a, b)
    out, grp_w, tok_w = one(query, x, IDS, mask=keep)
    best = grp_w.argmax(-1, keepdim=True)  # (B, Lq, 1)
    inside = (IDS[:, None, :] == best) & keep[:, None, :]  # (B, Lq, n)
    q, k, v = one.q_proj(query), one.k_proj(x), one.v_proj(x)
    flat = attnkit.attention(q, k, v, mask=inside, return_weights=True)
    torch.testing.assert_close(out, flat.output, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(tok_w, flat.weights, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("cls", [SegmentAttention, TieredAttention])
def test_fully_masked_sample_gives_zero_and_finite_grads(cls):
    attn = cls(D, query_dim=DQ).double()
    query, x = _randn(B, LQ, DQ).requires_grad_(), _randn(B, N, D, seed=1).requires_grad_()
    keep = torch.ones(B, N, dtype=torch.bool)
    keep[1] = False
    out, seg_w, tok_w = attn(query, x, IDS, mask=keep)
    assert not out[1].any() and not seg_w[1].any() and not tok_w[1].any()
    out.sum().backward()
    assert torch.isfinite(query.grad).all() and torch.isfinite(x.grad).all()
    assert not query.grad[1].any() and not x.grad[1].any()


@pytest.mark.parametrize("cls", [SegmentAttention, TieredAttention])
def test_masked_tokens_cannot_leak(cls):
    attn = cls(D, query_dim=DQ).double()
    query, x, keep = _inputs()
    clean = attn(query, x, IDS, mask=keep)
    dirty = attn(query, x.masked_fill(~keep[..., None], 1e6), IDS, mask=keep)
    for a, b in zip(clean, dirty, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=N, max_size=N), st.lists(st.booleans(), min_size=N, max_size=N),
       st.sampled_from([None, 1, 2]))
def test_tiered_weights_factorise(ids, keep, top_k):
    attn = TieredAttention(3, top_k=top_k).double()
    ids_t, keep_t = torch.tensor(ids), torch.tensor([keep])
    x = _randn(1, N, 3)
    _, grp_w, tok_w = attn(x, x, ids_t, mask=keep_t, num_groups=4)
    assert (tok_w[..., ~keep_t[0]] == 0).all()
    per_group = torch.zeros_like(grp_w).scatter_add(-1, ids_t.expand_as(tok_w), tok_w)
    torch.testing.assert_close(per_group, grp_w, rtol=1e-12, atol=1e-13)  # each group's tokens share alpha_g
    expected = 1.0 if any(keep) else 0.0
    torch.testing.assert_close(tok_w.sum(-1), torch.full((1, N), expected, dtype=torch.float64))


@pytest.mark.parametrize("make", [
    lambda: SegmentAttention(3, query_dim=2), lambda: SegmentAttention(3, pool="attention", query_dim=2),
    lambda: TieredAttention(3, query_dim=2), lambda: TieredAttention(3, query_dim=2, top_k=1)])
def test_gradcheck(make):
    attn = make().double()
    ids = torch.tensor([0, 0, 1, 2, 2])
    keep = torch.tensor([[True, True, True, True, False], [True, False, True, True, True]])
    query, x = _randn(2, 3, 2).requires_grad_(), _randn(2, 5, 3, seed=1).requires_grad_()
    assert gradcheck(lambda q, x: attn(q, x, ids, mask=keep).output, (query, x))


@pytest.mark.parametrize("cls,kwargs", [(SegmentAttention, {"pool": "attention"}), (TieredAttention, {"top_k": 2})])
def test_state_dict_round_trip(cls, kwargs):
    torch.manual_seed(0)
    a = cls(D, query_dim=DQ, **kwargs).double()
    torch.manual_seed(1)
    b = cls(D, query_dim=DQ, **kwargs).double()
    query, x, keep = _inputs()
    assert not torch.allclose(a(query, x, IDS, mask=keep).output, b(query, x, IDS, mask=keep).output)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(query, x, IDS, mask=keep).output, b(query, x, IDS, mask=keep).output)


@pytest.mark.parametrize("cls", [SegmentAttention, TieredAttention])
def test_bad_inputs(cls):
    attn = cls(D, query_dim=DQ)
    query, x = torch.randn(B, LQ, DQ), torch.randn(B, N, D)
    with pytest.raises(ShapeError, match=r"query must have shape \(batch=2, length, 4\)"):
        attn(torch.randn(B, LQ, D), x, IDS)
    with pytest.raises(DTypeError, match="segment ids must be an integer tensor"):
        attn(query, x, IDS.float())
    with pytest.raises(ShapeError, match=r"segment ids must have shape \(7,\) or \(2, 7\)"):
        attn(query, x, IDS[:, :5])
    with pytest.raises(ArgumentError, match=r"segment ids must lie in \[0, 2\)"):
        attn(query, x, IDS, num_segments=2) if cls is SegmentAttention else attn(query, x, IDS, num_groups=2)
    with pytest.raises(DTypeError, match="mask must be a bool"):
        attn(query, x, IDS, mask=torch.ones(B, N))


def test_bad_options():
    with pytest.raises(ArgumentError, match="pool must be"):
        SegmentAttention(D, pool="max")
    with pytest.raises(ArgumentError, match="top_k must be None or an int >= 1"):
        TieredAttention(D, top_k=0)


def test_registry_examples_run():
    for name in ("segment-attention", "tiered-attention"):
        module, inputs = get(name).example()
        out = module(*inputs)
        assert out.output.shape == (2, 4, 8) and out.segment_weights.shape == (2, 4, 3)
