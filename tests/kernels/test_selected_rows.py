"""Selected keys shared by the heads with a causal mask (DSA): sampled dot products and embedding-bag sums."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import attnkit
from attnkit import masks
from attnkit.kernels import selected_rows
from tests.helpers import rand_qkv
from tests.kernels.test_selected import _oracle

CASES = {  # name: (B, H, Hkv, L, D, keys per query)
    "grouped keys": (2, 4, 2, 23, 8, 5),
    "more slots than keys": (1, 2, 2, 17, 4, 20),
}


@pytest.fixture(autouse=True, params=["kept, rows sorted", "recomputed"])
def weights_kept(request, monkeypatch):
    """A few queries per chunk. The backward reads the forward's weights, each row's keys sorted first (as past
    ``SORT_BYTES``), or recomputes the weights (past ``SAVE_BUDGET``) over the rows as given."""
    monkeypatch.setattr(selected_rows, "SLOTS", 40)
    if request.param == "recomputed":
        monkeypatch.setattr(selected_rows, "SAVE_BUDGET", 0)
    else:
        monkeypatch.setattr(selected_rows, "SORT_BYTES", 0)


@pytest.mark.parametrize("name", list(CASES))
def test_the_per_query_rows_equal_the_oracle_forward_and_backward(name):
    b, h, hkv, n, d, slots = CASES[name]
    q, k, v = rand_qkv(b, h, n, n, d, d, hkv=hkv, dtype=torch.float64, seed=0, requires_grad=True)
    indices = torch.randint(-1, n, (b, n, slots), generator=torch.Generator().manual_seed(1))  # -1: unused; later keys
    mask = masks.selected_keys(indices) & masks.causal()
    decision = attnkit.explain(q, k, v, mask=mask, backend="blocksparse")
    assert decision.path == "blocksparse-gathered" and "sparse products" in str(decision) and "L*k" in str(decision)
    with torch.no_grad():  # the lse carries no gradient on this path: asked for under autograd, another path runs
        result = attnkit.attention(q, k, v, mask=mask, backend="blocksparse", return_lse=True)
    out, lse = _oracle(q, k, v, indices[:, None], 1, h, causal=True)
    torch.testing.assert_close(result.output, out, rtol=0, atol=1e-12)
    assert bool(((result.lse == -math.inf) == (lse == -math.inf)).all())
    torch.testing.assert_close(result.lse.nan_to_num(0.0, 0.0, 0.0), lse.nan_to_num(0.0, 0.0, 0.0), rtol=0,
                               atol=1e-12)
    w = torch.randn_like(out)
    grads = torch.autograd.grad((attnkit.attention(q, k, v, mask=mask, backend="blocksparse") * w).sum(), (q, k, v))
    dense = mask.materialize(n, n, batch=b, heads=h)
    from tests.oracle import dense_attention  # the independent dense oracle, differentiated in float64

    exact = torch.autograd.grad((dense_attention(q, k, v, mask=dense, differentiable=True) * w).sum(), (q, k, v))
    for got, want in zip(grads, exact, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-11)


def test_with_every_key_selected_it_is_dense_causal_attention():
    q, k, v = rand_qkv(2, 2, 19, 19, 8, 8, dtype=torch.float64, seed=4, requires_grad=True)
    mask = masks.selected_keys(torch.arange(19).expand(2, 19, 19)) & masks.causal()
    out = attnkit.attention(q, k, v, mask=mask, backend="blocksparse")
    dense = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, dense, rtol=0, atol=1e-12)
    w = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad((out * w).sum(), (q, k, v)),
                         torch.autograd.grad((dense * w).sum(), (q, k, v)), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_the_cost_grows_with_length_times_selected_keys():
    def flops(n):
        q, k, v = rand_qkv(1, 2, n, n, 8, 8, seed=0)
        idx = (torch.arange(n).view(-1, 1) - torch.arange(16)).clamp(min=-1).unsqueeze(0)
        decision = attnkit.explain(q, k, v, mask=masks.selected_keys(idx) & masks.causal(), backend="blocksparse")
        assert "L*k" in str(decision)
        return decision.flops
    assert flops(2048) < 2.2 * flops(1024)


def test_chunks_whose_slots_are_all_real_equal_the_sliding_window():
    """Each query's last 5 keys: every chunk past the first rows has no masked slot (no mask is applied there);
    forward and backward equal SDPA with the window as a dense mask."""
    n, w = 29, 5
    q, k, v = rand_qkv(1, 2, n, n, 8, 8, dtype=torch.float64, seed=6, requires_grad=True)
    idx = (torch.arange(n).view(-1, 1) - torch.arange(w)).clamp(min=-1).unsqueeze(0)
    out = attnkit.attention(q, k, v, mask=masks.selected_keys(idx) & masks.causal(), backend="blocksparse")
    t = torch.arange(n)
    band = (t.view(-1, 1) >= t) & (t.view(-1, 1) - t < w)
    dense = F.scaled_dot_product_attention(q, k, v, attn_mask=band)
    torch.testing.assert_close(out, dense, rtol=0, atol=1e-12)
    g = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad((out * g).sum(), (q, k, v)),
                         torch.autograd.grad((dense * g).sum(), (q, k, v)), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
