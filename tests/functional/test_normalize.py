"""The fused masked softmax (``functional/normalize.py``): the same weights whether or not it reuses the scores."""

from __future__ import annotations

import torch

import attnkit
from attnkit.functional.normalize import masked_softmax
from tests.helpers import rand_qkv


def _scores_and_mask():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(2, 3, 5, 7, generator=g, dtype=torch.float64)
    allowed = torch.rand(1, 3, 5, 7, generator=g) > 0.3
    allowed[0, 1, 2] = False  # a row with no allowed key
    return scores, allowed


def test_without_lse_or_graph_the_weights_overwrite_the_scores_with_the_same_bits():
    scores, allowed = _scores_and_mask()
    want, lse = masked_softmax(scores.clone(), allowed)  # with the lse: a buffer of its own
    assert lse is not None
    got, none = masked_softmax(scores.clone(), allowed, need_lse=False)
    assert none is None and torch.equal(got, want) and not got[0, 1, 2].any()
    buffer = scores.clone()  # no mask: the weights are the scores' buffer
    got, _ = masked_softmax(buffer, None, need_lse=False)
    assert got.data_ptr() == buffer.data_ptr() and torch.equal(got, torch.softmax(scores, -1))
    recorded = scores.clone().requires_grad_()
    weights, _ = masked_softmax(recorded * 1.0, allowed, need_lse=False)  # a graph: its own buffer, differentiable
    assert weights.requires_grad and torch.equal(weights.detach(), want)


def test_attention_weights_under_vmap_without_grad():
    """vmap has no batching rule for the in-place softmax: under a torch.func transform the weights get a buffer."""
    q, k, v = rand_qkv(3, 2, 4, 6, 8)
    with torch.no_grad():
        got = torch.func.vmap(lambda a, b, c: attnkit.attention(a, b, c, return_weights=True).weights)(q, k, v)
        want = torch.stack([attnkit.attention(*t, return_weights=True).weights for t in zip(q, k, v, strict=True)])
    torch.testing.assert_close(got, want)
