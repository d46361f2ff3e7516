"""Top-k sparse attention against a float64 transcription of its formula (Zhao et al. 2019, arXiv:1912.11637)."""

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.functional.topk import topk_attention
from attnkit.masks import causal

TOL = dict(rtol=0, atol=1e-10)


def oracle(q, k, v, top_k, masked):
    """Scores; per row the allowed entries sorted, the top_k-th kept as threshold; softmax of those at or above it."""
    groups = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ kk.transpose(-1, -2) * q.shape[-1] ** -0.5
    lq, lk = scores.shape[-2:]
    allowed = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq) if masked else torch.ones(lq, lk, dtype=torch.bool)
    out = torch.zeros(*scores.shape[:-1], v.shape[-1], dtype=torch.float64)
    for i in range(lq):
        row = scores[..., i, :].masked_fill(~allowed[i], float("-inf"))
        ranked = row.sort(-1, descending=True).values
        threshold = ranked[..., min(top_k, int(allowed[i].sum())) - 1:][..., :1]
        weights = row.masked_fill(row < threshold, float("-inf")).softmax(-1)
        out[..., i, :] = (weights[..., None] * vv).sum(-2)
    return out


@pytest.mark.parametrize("backend", ["reference", "auto"])
@pytest.mark.parametrize("masked", [False, True])
def test_equals_the_formula_forward_and_backward(backend, masked):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 9, 5, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 2, 9, 5, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out = topk_attention(q, k, v, 3, mask=causal() if masked else None, backend=backend)
    want = oracle(q, k, v, 3, masked)
    torch.testing.assert_close(out, want, **TOL)
    w = torch.randn_like(want)
    for a, e in zip(torch.autograd.grad((out * w).sum(), [q, k, v]), torch.autograd.grad((want * w).sum(), [q, k, v]),
                    strict=True):
        torch.testing.assert_close(a, e, **TOL)


def test_each_row_attends_to_exactly_top_k_keys():
    q, k = torch.randn(2, 1, 2, 7, 4, dtype=torch.float64).unbind(0)
    v = torch.eye(7, dtype=torch.float64)[None, None].expand(1, 2, 7, 7)  # the output row is the weights
    weights = topk_attention(q, k, v, 2)
    assert ((weights > 0).sum(-1) == 2).all()


def test_a_bias_is_refused_by_name():
    q = torch.randn(1, 1, 3, 4)
    with pytest.raises(ArgumentError, match="bias is not supported"):
        topk_attention(q, q, q, 2, bias=torch.zeros(3, 3))
