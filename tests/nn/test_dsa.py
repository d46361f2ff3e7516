"""DSA: the lightning indexer (eq. 1), top-k attention (eq. 2) and the KL losses (eq. 3-4), transcribed in float64."""

from __future__ import annotations

import math

import torch

import attnkit
from attnkit import masks
from attnkit.nn import DSAIndexer, DSASparseAttention
from attnkit.nn.dsa import indexer_kl
from tests.helpers import randomized_float64


def _index_scores(indexer, x):
    """eq. 1 by loops: I[t, s] = sum_j w[t, j] ReLU(q[t, j] . k[s]), with the reference code's scales."""
    x = x.double()
    hi, di = indexer.index_heads, indexer.index_dim
    q = (x @ indexer.q_proj.weight.double().T).view(*x.shape[:2], hi, di)
    k = x @ indexer.k_proj.weight.double().T
    w = x @ indexer.w_proj.weight.double().T
    batch, n = x.shape[:2]
    out = torch.full((batch, n, n), -math.inf, dtype=torch.float64)
    for b in range(batch):
        for t in range(n):
            for s in range(t + 1):
                out[b, t, s] = sum(w[b, t, j] * hi ** -0.5 * torch.relu(q[b, t, j] @ k[b, s] * di ** -0.5)
                                   for j in range(hi))
    return out


def _is_top_k(row, chosen, k):
    """``chosen`` is a top-k of ``row`` (ReLU makes ties of 0 common: any order among them is a top-k)."""
    chosen = [c for c in chosen.tolist() if c >= 0]
    rest = [s for s in range(len(row)) if s not in chosen]
    return len(chosen) == min(k, len(row)) and (not rest or min(row[chosen]) >= max(row[rest]))


def test_the_indexer_scores_and_top_k_follow_eq_1():
    indexer = randomized_float64(DSAIndexer(10, index_heads=3, index_dim=4, top_k=5))
    x = torch.randn(2, 9, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    scores = _index_scores(indexer, x)
    torch.testing.assert_close(indexer.scores(x), scores, rtol=0, atol=1e-12)
    chosen = indexer(x)
    for b in range(2):
        for t in range(9):
            assert _is_top_k(scores[b, t, :t + 1], chosen[b, t], 5)
            assert (chosen[b, t] == -1).sum() == max(0, 5 - t - 1)


def test_sparse_attention_equals_attention_over_each_querys_top_k_keys():
    layer = randomized_float64(DSASparseAttention(12, 3, top_k=4, index_heads=2, index_dim=3))
    x = torch.randn(2, 11, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    scores = _index_scores(layer.indexer, x)
    chosen = layer.indexer(x)
    q, k, v = layer.project(x)
    out = torch.zeros_like(q)
    for b in range(2):
        for t in range(11):
            assert _is_top_k(scores[b, t, :t + 1], chosen[b, t], 4)
            keys = chosen[b, t][chosen[b, t] >= 0]
            w = torch.softmax((k[b, :, keys] @ q[b, :, t, :, None]).squeeze(-1) / 2.0, -1)  # D = 4
            out[b, :, t] = (w.unsqueeze(-2) @ v[b, :, keys]).squeeze(-2)
    torch.testing.assert_close(layer(x), layer.merge_heads(out), rtol=0, atol=1e-12)


def test_with_k_at_least_the_length_dsa_is_dense_causal_attention():
    layer = randomized_float64(DSASparseAttention(12, 3, top_k=64, index_heads=2, index_dim=3))
    x = torch.randn(2, 17, 12, dtype=torch.float64, requires_grad=True)
    q, k, v = layer.project(x)
    torch.testing.assert_close(layer(x), layer.merge_heads(attnkit.attention(q, k, v, mask=masks.causal())),
                               rtol=0, atol=1e-12)
    layer(x).sum().backward()
    assert layer.indexer.q_proj.weight.grad is None  # the selection carries no gradient
    assert layer.q_proj.weight.grad.abs().sum() > 0


def test_the_warm_up_and_sparse_losses_are_the_kl_divergences_of_eq_3_and_4():
    layer = randomized_float64(DSASparseAttention(12, 3, top_k=3, index_heads=2, index_dim=3))
    x = torch.randn(1, 7, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    q, k, _ = layer.project(x)
    weights = torch.softmax((q @ k.transpose(-1, -2) / 2.0).masked_fill(
        torch.ones(7, 7, dtype=torch.bool).triu(1), -math.inf), -1)
    target = weights.sum(1)[0]
    scores = _index_scores(layer.indexer, x)[0]
    for sparse in (False, True):
        total = 0.0
        for t in range(7):
            keep = list(range(t + 1)) if not sparse else [s for s in layer.indexer(x)[0, t].tolist() if s >= 0]
            p = target[t, keep] / target[t, keep].sum()
            log_q = torch.log_softmax(scores[t, keep], 0)
            total += float((p * (p.log() - log_q)).sum().detach())
        assert math.isclose(float(layer.indexer_loss(x, sparse=sparse).detach()), total, rel_tol=1e-10)
    loss = layer.indexer_loss(x)
    loss.backward()
    assert layer.indexer.q_proj.weight.grad.abs().sum() > 0 and layer.q_proj.weight.grad is None


def test_indexer_kl_is_zero_when_the_indexer_matches_the_target():
    weights = torch.softmax(torch.randn(2, 3, 5, 5, dtype=torch.float64), -1)
    scores = (weights.sum(1) / 3).log()
    assert float(indexer_kl(scores, weights)) < 1e-12


def test_an_empty_sequence_gives_an_empty_output():
    layer = DSASparseAttention(16, 2, index_heads=2, index_dim=4, top_k=3)
    x = torch.randn(2, 0, 16, requires_grad=True)
    out = layer(x)
    assert out.shape == (2, 0, 16)
    out.sum().backward()
    assert x.grad.shape == (2, 0, 16)


def test_the_indexer_in_chunks_of_queries_picks_the_same_top_k(monkeypatch):
    """A few queries per chunk, each scoring only the keys up to its last query (and a key_keep_mask): a top-k of
    eq. 1's scores."""
    from attnkit.nn import dsa

    monkeypatch.setattr(dsa, "_ROWS", 30)  # 3 queries per chunk at n = 10
    indexer = randomized_float64(DSAIndexer(10, index_heads=3, index_dim=4, top_k=4))
    x = torch.randn(2, 10, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    keep = torch.ones(2, 10, dtype=torch.bool)
    keep[1, 2] = False
    scores = _index_scores(indexer, x).masked_fill(~keep[:, None, :], -math.inf)
    chosen = indexer(x, key_keep_mask=keep)
    for b in range(2):
        for t in range(10):
            seen = [s for s in range(t + 1) if keep[b, s]]
            got = [c for c in chosen[b, t].tolist() if c >= 0]
            assert len(got) == min(4, len(seen)) and set(got) <= set(seen)
            rest = [s for s in seen if s not in got]
            assert not rest or min(scores[b, t, got]) >= max(scores[b, t, rest])
