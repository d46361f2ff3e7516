"""Selected keys on the gathered path: each query's own keys gathered, against a float64 per-query oracle."""

from __future__ import annotations

import math

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.core import _prepare
from attnkit.kernels import dispatch, selected
from tests.helpers import rand_qkv


def _oracle(q, k, v, indices, block_size, group, causal=False):
    """Per query, by loops: softmax over the distinct keys its index head lists (then causality), in float64."""
    q, k, v = (t.detach().double() for t in (q, k, v))
    batch, heads, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    out = torch.zeros(batch, heads, lq, v.shape[-1], dtype=torch.float64)
    lse = torch.full((batch, heads, lq), -math.inf, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            s = 0 if indices.shape[1] == 1 else h // group
            kh = h // (heads // hkv)
            for i in range(lq):
                row = indices[b if indices.shape[0] > 1 else 0, s, i if indices.shape[2] > 1 else 0].tolist()
                keys = sorted({j for blk in row if blk >= 0 for j in range(blk * block_size, (blk + 1) * block_size)
                               if j < lk and (not causal or j <= i + lk - lq)})
                if not keys:
                    continue
                scores = k[b, kh, keys] @ q[b, h, i] / math.sqrt(d)
                lse[b, h, i] = torch.logsumexp(scores, 0)
                out[b, h, i] = torch.softmax(scores, 0) @ v[b, kh, keys]
    return out, lse


CASES = {  # name: (B, H, Hkv, Lq, Lk, D, Dv, index shape (B, Hs, Lq, n), block size, group size, causal)
    "keys shared by the heads": (2, 3, 3, 5, 7, 11, 11, (2, 1, 5, 4), 1, None, False),
    "keys per query head, causal": (2, 3, 3, 13, 13, 11, 5, (2, 3, 13, 4), 1, 1, True),
    "blocks per key/value group": (2, 6, 2, 17, 23, 11, 11, (2, 2, 17, 3), 4, 3, True),
    "blocks per query head, grouped keys": (1, 4, 2, 9, 16, 7, 9, (1, 4, 9, 2), 5, 1, False),
    "one selection for every query": (2, 3, 1, 6, 40, 11, 11, (2, 1, 1, 7), 3, None, True),
}


def _case(name, seed=0):
    b, h, hkv, lq, lk, d, dv, shape, bs, group, causal = CASES[name]
    q, k, v = rand_qkv(b, h, lq, lk, d, dv, hkv=hkv, dtype=torch.float64, seed=seed, requires_grad=True)
    g = torch.Generator().manual_seed(seed + 1)
    indices = torch.randint(-1, -(-lk // bs), shape, generator=g)  # -1 and repeats (a block past the keys: refused)
    mask = masks.selected_blocks(indices, bs, group_size=group) if bs > 1 else masks.selected_keys(
        indices[:, 0] if shape[1] == 1 and shape[2] > 1 else indices, group_size=group)
    return q, k, v, indices, bs, group or h, causal, (mask & masks.causal() if causal else mask)


@pytest.mark.parametrize("name", list(CASES))
def test_the_gathered_path_equals_the_per_query_oracle_forward_and_backward(name):
    q, k, v, indices, bs, group, causal, mask = _case(name)
    assert attnkit.explain(q, k, v, mask=mask, backend="blocksparse").path == "blocksparse-gathered"
    result = attnkit.attention(q, k, v, mask=mask, backend="blocksparse", return_lse=True)
    out, lse = _oracle(q, k, v, indices, bs, group, causal)
    torch.testing.assert_close(result.output, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(result.lse, lse, rtol=0, atol=1e-12)
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((result.output * weights).sum(), (q, k, v))
    dense = mask.materialize(q.shape[2], k.shape[2], batch=q.shape[0], heads=q.shape[1])
    from tests.oracle import dense_attention  # the independent dense oracle, differentiated in float64

    exact = torch.autograd.grad((dense_attention(q, k, v, mask=dense, differentiable=True) * weights).sum(), (q, k, v))
    for got, want in zip(grads, exact, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-11)


@pytest.mark.parametrize("name", ["keys per query head, causal", "one selection for every query"])
def test_sinks_join_the_selection_forward_and_backward(name):
    from tests.oracle import dense_attention

    q, k, v, *_, mask = _case(name, seed=7)
    sinks = (2 * torch.randn(q.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(8)))
    sinks.requires_grad_()
    assert attnkit.explain(q, k, v, mask=mask, sinks=sinks, backend="blocksparse").path == "blocksparse-gathered"
    result = attnkit.attention(q, k, v, mask=mask, sinks=sinks, return_lse=True, backend="blocksparse")
    dense = mask.materialize(q.shape[2], k.shape[2], batch=q.shape[0], heads=q.shape[1])
    want = dense_attention(q, k, v, mask=dense, sinks=sinks, return_lse=True, differentiable=True)
    torch.testing.assert_close(result.output, want.output, rtol=0, atol=1e-12)
    torch.testing.assert_close(result.lse, want.lse, rtol=0, atol=1e-12)
    weights = torch.randn_like(want.output)
    got = torch.autograd.grad((result.output * weights).sum(), (q, k, v, sinks))
    exact = torch.autograd.grad((want.output * weights).sum(), (q, k, v, sinks))
    for a, b in zip(got, exact, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11)


@pytest.mark.parametrize("backend", ["reference", "chunked", "sdpa"])
def test_every_backend_computes_the_same_selection(backend):
    q, k, v, indices, bs, group, causal, mask = _case("blocks per key/value group", seed=3)
    out, _ = _oracle(q, k, v, indices, bs, group, causal)
    torch.testing.assert_close(attnkit.attention(q, k, v, mask=mask, backend=backend), out, rtol=0, atol=1e-12)


def test_a_shared_selection_is_split_and_merged_by_log_sum_exp(monkeypatch):
    q, k, v, indices, bs, group, causal, mask = _case("one selection for every query", seed=4)
    monkeypatch.setattr(selected, "SPLIT_KEYS", 6)  # 21 keys in splits of 6: four partials per row
    assert selected.plan(_prepare(q, k, v, mask=mask)).keys == 6
    result = attnkit.attention(q, k, v, mask=mask, return_lse=True)
    out, lse = _oracle(q, k, v, indices, bs, group, causal)
    torch.testing.assert_close(result.output, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(result.lse, lse, rtol=0, atol=1e-12)


@pytest.mark.parametrize("heads,kv_heads,index_heads", [(4, 4, 4), (6, 2, 2), (4, 2, 4)])
def test_a_decoding_step_with_a_selection_per_head_runs_on_the_fused_kernel_exactly(heads, kv_heads, index_heads):
    """One query, no autograd, each index head its own blocks (NSA's decoding step): torch's kernel per split, the
    mask per query head (an index head finer than, equal to or coarser than the key/value heads)."""
    q, k, v = rand_qkv(2, heads, 1, 50, 8, hkv=kv_heads, dtype=torch.float64, seed=9)
    indices = torch.randint(-1, 10, (2, index_heads, 1, 4), generator=torch.Generator().manual_seed(10))
    group = heads // index_heads
    mask = masks.selected_blocks(indices, 5, group_size=group)
    p = _prepare(q, k, v, mask=mask)
    assert selected.fused_ok(p, selected.plan(p))
    result = attnkit.attention(q, k, v, mask=mask, return_lse=True)
    out, lse = _oracle(q, k, v, indices, 5, group)
    torch.testing.assert_close(result.output, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(result.lse, lse, rtol=0, atol=1e-12)


def test_rows_that_select_nothing_give_zero_output_minus_inf_lse_and_zero_gradients():
    q, k, v = rand_qkv(2, 3, 5, 7, 11, dtype=torch.float64, requires_grad=True)
    indices = torch.randint(0, 7, (2, 5, 3), generator=torch.Generator().manual_seed(0))
    indices[:, 2] = -1
    result = attnkit.attention(q, k, v, mask=masks.selected_keys(indices), backend="blocksparse", return_lse=True)
    assert (result.output[:, :, 2] == 0).all() and (result.lse[:, :, 2] == -math.inf).all()
    dq, = torch.autograd.grad(result.output.sum(), (q,))
    assert (dq[:, :, 2] == 0).all() and torch.isfinite(dq).all()


def test_keys_no_query_selects_never_reach_the_output_or_the_gradients():
    q, k, v = rand_qkv(2, 3, 5, 9, 11, dtype=torch.float64)
    indices = torch.randint(0, 6, (2, 5, 3), generator=torch.Generator().manual_seed(0))
    indices[0, 0, 0] = -1  # an empty slot reads a clamped key: zeroed before use
    k, v = k.clone(), v.clone()
    k[:, :, 6:], v[:, :, 6:] = math.nan, math.inf
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = attnkit.attention(q, k, v, mask=masks.selected_keys(indices), backend="blocksparse")
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert torch.isfinite(out).all() and all(torch.isfinite(g).all() for g in grads)


def test_the_cost_grows_with_queries_times_selected_keys_not_with_the_keys():
    def flops(lq, lk, n):
        q, k, v = rand_qkv(1, 2, lq, lk, 8)
        indices = torch.zeros(1, lq, n, dtype=torch.long)
        return attnkit.explain(q, k, v, mask=masks.selected_keys(indices), backend="blocksparse").flops

    assert flops(512, 4096, 64) == flops(512, 1024, 64) == 2 * flops(256, 4096, 64) == 4 * flops(512, 4096, 16)
    assert flops(512, 4096, 64) == 2 * 2 * (2 * 512 * 64 * 8)  # 2 heads, q k^T and weights @ v


def test_auto_prefers_the_gathered_path_while_the_selection_is_sparse():
    q, k, v = rand_qkv(1, 2, 300, 300, 8)
    sparse = masks.selected_keys(torch.zeros(1, 300, 16, dtype=torch.long))
    decision = attnkit.explain(q, k, v, mask=sparse)
    assert decision.path == "blocksparse-gathered" and math.isclose(decision.block_density, 16 / 300)
    assert "selected keys per query gathered" in decision.reasons["blocksparse-gathered"]
    _, ran = dispatch.execute(_prepare(q, k, v, mask=sparse))
    assert ran.name == "blocksparse-gathered"
