"""Second derivatives (``create_graph=True``: gradient penalties) through every execution path.

Paths with a hand-written backward (torch's CPU kernel called directly, band windows, fused and
masked block-sparse slabs, bias slabs, the soft-cap loop) would lose the second-order term: their
first backward returns gradients no graph records. Each is made twice differentiable
(``pipeline.twice_differentiable``); this checks, on every row of the table and on the fast lane,
that a gradient penalty's gradients equal those of the float64 oracle (tests/oracle.py) differentiated twice.
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from tests.helpers import rand_qkv
from tests.kernels.test_paths import REACH
from tests.oracle import dense_attention


def _penalty_grads(fn, q, k, v, bias=None):
    """Gradients of ``|d <out, w> / dq|^2`` with respect to q, k, v (and a tensor bias): second order in q."""
    out = fn(q, k, v)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    (dq,) = torch.autograd.grad((out * w).sum(), q, create_graph=True)
    leaves = (q, k, v) if bias is None else (q, k, v, bias)
    return torch.autograd.grad(dq.square().sum(), leaves, allow_unused=True)


@pytest.mark.parametrize("name", list(REACH))
def test_a_gradient_penalty_through_every_path_equals_the_oracle(name):
    sizes, kwargs = REACH[name]
    q, k, v = rand_qkv(1, 3, sizes["lq"], sizes["lk"], 11, sizes.get("dv"), dtype=torch.float64, seed=5,
                       requires_grad=True)
    if "seqused_k" in kwargs:  # a full cache of one sequence: the oracle's plain call
        kwargs = {**kwargs, "seqused_k": kwargs["seqused_k"][:1]}
    same = {key: value for key, value in kwargs.items() if key != "seqused_k"}
    assert attnkit.explain(q, k, v, **kwargs).path == name
    got = _penalty_grads(lambda q, k, v: attnkit.attention(q, k, v, **kwargs), q, k, v)
    want = _penalty_grads(lambda q, k, v: dense_attention(q, k, v, differentiable=True, **same), q, k, v)
    for a, b in zip(got, want, strict=True):
        if b is None:  # no second-order path in the oracle either (sparsemax is piecewise linear)
            assert a is None or not a.any()
            continue
        assert a is not None, "the second-order term was lost"
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


def test_a_gradient_penalty_through_the_fast_lane_and_a_learned_bias():
    q, k, v = rand_qkv(2, 4, 1, 9, 8, hkv=2, dtype=torch.float64, seed=1, requires_grad=True)
    decode = dict(mask=attnkit.masks.causal())
    assert attnkit.explain(q, k, v, **decode).lane is not None
    got = _penalty_grads(lambda q, k, v: attnkit.attention(q, k, v, **decode), q, k, v)
    want = _penalty_grads(lambda q, k, v: dense_attention(q, k, v, differentiable=True, **decode), q, k, v)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)
    q, k, v = rand_qkv(1, 3, 200, 200, 11, dtype=torch.float64, seed=2, requires_grad=True)
    bias = torch.randn(1, 3, 200, 200, dtype=torch.float64, requires_grad=True)
    assert attnkit.explain(q, k, v, bias=bias).path == "bias-slabs"
    got = _penalty_grads(lambda q, k, v: attnkit.attention(q, k, v, bias=bias), q, k, v, bias)
    want = _penalty_grads(lambda q, k, v: dense_attention(q, k, v, bias=bias, differentiable=True), q, k, v, bias)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


def test_first_derivatives_keep_the_paths_own_backward(monkeypatch):
    """Without create_graph nothing is recomputed: the reference path never runs in the backward."""
    from attnkit.kernels import reference
    calls = []
    monkeypatch.setattr(reference, "run", lambda p: calls.append(p) or reference.run(p))
    q, k, v = rand_qkv(1, 2, 300, 300, 8, requires_grad=True)
    attnkit.attention(q, k, v, mask=attnkit.masks.sliding_window(16, 16)).sum().backward()
    assert not calls and q.grad is not None


@pytest.mark.parametrize("lq, lk, hkv", [(6, 6, 3), (3, 9, 3), (4, 4, 1)])  # causal; chunked prefill (float mask); GQA
def test_the_fast_lane_differentiates_twice_whichever_inputs_autograd_asks_for(lq, lk, hkv):
    """The lane keeps torch's node and hooks it: under create_graph, only the operands asked for get gradients
    (the others None, as autograd expects), each the oracle's; a leaf without requires_grad stays out."""
    mask = attnkit.masks.causal()
    q, k, v = rand_qkv(2, 3, lq, lk, 8, hkv=hkv, dtype=torch.float64, seed=7, requires_grad=True)
    assert attnkit.explain(q, k, v, mask=mask).lane is not None
    w = torch.randn(2, 3, lq, 8, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def penalty(fn, wrt, leaves):  # |d <out, w> / d wrt|^2, differentiated with respect to leaves
        (dx,) = torch.autograd.grad((fn(q, k, v) * w).sum(), wrt, create_graph=True)
        return torch.autograd.grad(dx.square().sum(), leaves)

    ours = lambda q, k, v: attnkit.attention(q, k, v, mask=mask)
    oracle = lambda q, k, v: dense_attention(q, k, v, mask=mask, differentiable=True)
    for wrt, leaves in ((k, (q, k, v)), (v, (q, k)), (q, (v,))):
        for a, b in zip(penalty(ours, wrt, leaves), penalty(oracle, wrt, leaves), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)
    q.requires_grad_(False)  # k and v only: the node has no edge to q
    (dk,) = torch.autograd.grad((ours(q, k, v) * w).sum(), k, create_graph=True)
    (dk_want,) = torch.autograd.grad((oracle(q, k, v) * w).sum(), k, create_graph=True)
    for a, b in zip(torch.autograd.grad(dk.square().sum(), (k, v)),
                    torch.autograd.grad(dk_want.square().sum(), (k, v)), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)


def test_a_first_derivative_through_the_fast_lane_is_torchs_own_backward(monkeypatch):
    """Without create_graph the lane's call has torch's kernel node only, and nothing is recomputed."""
    from attnkit.kernels import reference
    calls = []
    monkeypatch.setattr(reference, "run", lambda p: calls.append(p) or reference.run(p))
    q, k, v = rand_qkv(2, 3, 16, 16, 8, requires_grad=True)
    out = attnkit.attention(q, k, v, mask=attnkit.masks.causal())
    assert "FlashAttentionForCpuBackward" in type(out.grad_fn).__name__
    out.sum().backward()
    assert not calls and q.grad is not None and k.grad is not None and v.grad is not None
