"""Persistent memory key-values against a float64 transcription (Sukhbaatar et al. 2019, arXiv:1907.01470, eq. 5-6)."""

import pytest
import torch

from attnkit import masks
from attnkit.errors import ShapeError
from attnkit.functional.memory_kv import memory_kv_attention

TOL = dict(rtol=0, atol=1e-10)


def oracle(q, k, v, mk, mv, allowed):
    """Each query: softmax over the M memory scores and its allowed sequence scores, one explicit concatenation."""
    groups = q.shape[1] // k.shape[1]
    b = q.shape[0]
    keys = torch.cat([mk[None].expand(b, -1, -1, -1), k], 2).repeat_interleave(groups, 1)
    values = torch.cat([mv[None].expand(b, -1, -1, -1), v], 2).repeat_interleave(groups, 1)
    scores = q @ keys.transpose(-1, -2) * q.shape[-1] ** -0.5
    visible = torch.cat([torch.ones(*allowed.shape[:-1], mk.shape[1], dtype=torch.bool), allowed], -1)
    return scores.masked_fill(~visible, float("-inf")).softmax(-1) @ values


def problem(seed=0):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
    return rnd(2, 4, 6, 5), rnd(2, 2, 8, 5), rnd(2, 2, 8, 3), rnd(2, 3, 5), rnd(2, 3, 3)


@pytest.mark.parametrize("which", ["none", "causal", "window", "tensor"])
@pytest.mark.parametrize("backend", ["reference", "chunked", "auto"])
def test_equals_the_formula_forward_and_backward(which, backend):
    q, k, v, mk, mv = problem()
    lq, lk = 6, 8
    causal = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
    window = causal & ~torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq - 3)
    mask, allowed = {"none": (None, torch.ones(lq, lk, dtype=torch.bool)), "causal": (masks.causal(), causal),
                     "window": (masks.sliding_window(2), window), "tensor": (window, window)}[which]
    out = memory_kv_attention(q, k, v, mk, mv, mask=mask, backend=backend)
    want = oracle(q, k, v, mk, mv, allowed)
    torch.testing.assert_close(out, want, **TOL)
    leaves = [q, k, v, mk, mv]
    w = torch.randn_like(want)
    for a, e in zip(torch.autograd.grad((out * w).sum(), leaves), torch.autograd.grad((want * w).sum(), leaves),
                    strict=True):
        torch.testing.assert_close(a, e, **TOL)


def test_memory_shapes_are_checked():
    q, k, v, mk, mv = problem()
    with pytest.raises(ShapeError, match=r"memory_k must have shape \(Hkv, M, 5\) with Hkv = 2; got \(4, 3, 5\)"):
        memory_kv_attention(q, k, v, mk.repeat(2, 1, 1), mv)
    with pytest.raises(ShapeError, match="memory_v must hold the M = 3 slots of memory_k; got 2"):
        memory_kv_attention(q, k, v, mk, mv[:, :2])
