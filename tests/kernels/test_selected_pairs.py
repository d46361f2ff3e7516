"""Selected key blocks with a causal mask (NSA, MoBA): tiles of queries sharing a past block, merged by lse."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnkit
from attnkit import masks
from attnkit.kernels import selected_pairs
from tests.helpers import rand_qkv
from tests.kernels.test_selected import _oracle

CASES = {  # name: (B, H, Hkv, L, D, index shape (B, Hs, L, n), block size, group size)
    "blocks per query head": (2, 3, 3, 29, 8, (2, 3, 29, 3), 4, 1),
    "blocks per key/value group, grouped keys": (1, 6, 2, 37, 5, (1, 2, 37, 4), 5, 3),
    "one index head for every head, length a multiple of the block": (2, 2, 1, 32, 7, (2, 1, 32, 2), 8, None),
}


def _case(name, seed=0):
    b, h, hkv, n, d, shape, bs, group = CASES[name]
    q, k, v = rand_qkv(b, h, n, n, d, d, hkv=hkv, dtype=torch.float64, seed=seed, requires_grad=True)
    g = torch.Generator().manual_seed(seed + 1)
    indices = torch.randint(-1, -(-n // bs), shape, generator=g)  # -1 (unused), repeats, later blocks
    return q, k, v, indices, bs, group or h, masks.selected_blocks(indices, bs, group_size=group) & masks.causal()


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """Tiles of at most 5 queries in heights of 2, 4 and 5, a few tiles per batch: partial tiles, several heights,
    batches and merges on tiny inputs."""
    monkeypatch.setattr(selected_pairs, "ROWS", 5)
    monkeypatch.setattr(selected_pairs, "STEP", 2)
    monkeypatch.setattr(selected_pairs, "BUDGET", 300)


@pytest.mark.parametrize("name", list(CASES))
def test_the_tiled_path_equals_the_per_query_oracle_forward_and_backward(name):
    q, k, v, indices, bs, group, mask = _case(name)
    decision = attnkit.explain(q, k, v, mask=mask, backend="blocksparse")
    assert decision.path == "blocksparse-gathered" and "tiled by key block" in str(decision)
    with torch.no_grad():  # the lse carries no gradient on this path: asked for under autograd, another path runs
        result = attnkit.attention(q, k, v, mask=mask, backend="blocksparse", return_lse=True)
    out, lse = _oracle(q, k, v, indices, bs, group, causal=True)
    torch.testing.assert_close(result.output, out, rtol=0, atol=1e-12)
    torch.testing.assert_close(result.lse, lse, rtol=0, atol=1e-12)
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((attnkit.attention(q, k, v, mask=mask, backend="blocksparse") * weights).sum(),
                                (q, k, v))
    dense = mask.materialize(q.shape[2], k.shape[2], batch=q.shape[0], heads=q.shape[1])
    from tests.oracle import dense_attention  # the independent dense oracle, differentiated in float64

    exact = torch.autograd.grad((dense_attention(q, k, v, mask=dense, differentiable=True) * weights).sum(), (q, k, v))
    for got, want in zip(grads, exact, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-11)


def test_with_every_block_selected_it_is_dense_causal_attention():
    q, k, v = rand_qkv(2, 4, 50, 50, 8, 8, hkv=2, dtype=torch.float64, seed=3, requires_grad=True)
    every = torch.arange(-(-50 // 6)).expand(2, 2, 50, -1)
    mask = masks.selected_blocks(every, 6, group_size=2) & masks.causal()
    out = attnkit.attention(q, k, v, mask=mask, backend="blocksparse")
    dense = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
    torch.testing.assert_close(out, dense, rtol=0, atol=1e-12)
    w = torch.randn_like(out)
    for got, want in zip(torch.autograd.grad((out * w).sum(), (q, k, v)),
                         torch.autograd.grad((dense * w).sum(), (q, k, v)), strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_blocks_whose_lse_differ_by_far_more_than_the_reference_slack_merge_exactly(dtype):
    """Key blocks scaled so that the partial lse of one query differ by tens to hundreds (past the merge's slack
    and past exp's float32 range), the largest met first or last: the float64 per-query oracle."""
    n = CASES["blocks per query head"][3]
    q, k, v, indices, bs, group, mask = _case("blocks per query head", seed=7)
    scale = torch.tensor([1.0, 40.0, 3.0, 120.0, 0.5, 80.0, 10.0, 200.0])[torch.arange(n) // bs].view(1, 1, n, 1)
    k = (k.detach() * scale.to(k.dtype)).requires_grad_()
    with torch.no_grad():
        out, lse = _oracle(q, k, v, indices, bs, group, causal=True)
        qc, kc, vc = (t.detach().to(dtype) for t in (q, k, v))
        result = attnkit.attention(qc, kc, vc, mask=mask, backend="blocksparse", return_lse=True)
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=0, atol=1e-10)
    torch.testing.assert_close(result.output.double(), out, **tol)
    torch.testing.assert_close(result.lse.double(), lse, **tol)


def test_rows_that_select_nothing_give_zero_output_minus_inf_lse_and_zero_gradients():
    q, k, v = rand_qkv(1, 2, 12, 12, 4, 4, dtype=torch.float64, seed=5, requires_grad=True)
    indices = torch.full((1, 1, 12, 2), -1)
    indices[:, :, 6:, 0] = 0  # queries 0..5 select nothing (not even their own block)
    mask = masks.selected_blocks(indices, 4) & masks.causal()
    with torch.no_grad():
        result = attnkit.attention(q, k, v, mask=mask, backend="blocksparse", return_lse=True)
    assert bool((result.output[:, :, :6] == 0).all()) and bool((result.lse[:, :, :6] == float("-inf")).all())
    assert bool(torch.isfinite(result.lse[:, :, 6:]).all())
    dq = torch.autograd.grad(attnkit.attention(q, k, v, mask=mask, backend="blocksparse").sum(), q)[0]
    assert bool((dq[:, :, :6] == 0).all()) and bool(torch.isfinite(dq).all())


def test_the_tiles_hold_each_query_and_past_block_pair_once_and_no_later_block():
    g = torch.Generator().manual_seed(0)
    indices = masks.selected_blocks(torch.randint(-1, 8, (2, 2, 40, 4), generator=g), 5).indices
    tl = selected_pairs.tiles(indices, 2, 2, 2, 40, 5)
    own_block = torch.arange(40).view(1, 1, -1, 1) // 5
    assert tl.pairs == int(((indices >= 0) & (indices < own_block)).sum())
    assert sorted({rows.shape[1] for rows in tl.rows}) == [h for h in (2, 4, 5) if h in {r.shape[1] for r in tl.rows}]
    rows = torch.cat([r.flatten() for r in tl.rows])
    blocks = torch.cat([b[:, None].expand_as(r).flatten() for r, b in zip(tl.rows, tl.blocks, strict=True)])
    real = rows >= 0
    assert int(real.sum()) == tl.pairs
    pairs = (rows[real] * 8 + blocks[real] % 8).tolist()  # (flat query, key block): each pair once
    assert len(set(pairs)) == len(pairs)
    query, block = rows[real] % 40, blocks[real] % 8
    assert bool((block < query // 5).all())  # past blocks only: the own block runs in place, later ones never
    tiles = sum(r.shape[0] for r in tl.rows)  # fewer than STEP empty rows a tile, on average
    assert int((rows < 0).sum()) < 2 * tiles


def test_the_cost_grows_with_length_times_selected_blocks_not_with_length_squared():
    def cost(n):
        q, k, v = rand_qkv(1, 2, n, n, 8, 8, seed=0)
        own = torch.arange(n).view(1, 1, -1, 1) // 16
        indices = torch.cat([own, (own - 1).clamp(min=0), torch.zeros_like(own)], -1)
        decision = attnkit.explain(q, k, v, mask=masks.selected_blocks(indices, 16) & masks.causal(),
                                   backend="blocksparse")
        assert "L*k" in str(decision)
        return decision.flops
    assert cost(2048) < 2.2 * cost(1024)
