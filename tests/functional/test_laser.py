"""LASER against a float64 transcription of its formula (Duvvuri & Dhillon 2024, arXiv:2411.03493, eq. 4)."""

import pytest
import torch

from attnkit.functional.laser import laser_attention
from attnkit.masks import causal

TOL = dict(rtol=0, atol=1e-10)


def oracle(q, k, v, masked):
    """out_i = log sum_j w_ij exp(v_j): the weights of causal softmax attention, exp and log taken as written."""
    groups = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ kk.transpose(-1, -2) * q.shape[-1] ** -0.5
    if masked:
        lq, lk = scores.shape[-2:]
        scores = scores.masked_fill(~torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq), float("-inf"))
    return torch.log(scores.softmax(-1) @ vv.exp())


@pytest.mark.parametrize("backend", ["reference", "chunked", "auto"])
def test_equals_the_formula_forward_and_backward(backend):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 8, 5, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 8, 5, generator=g, dtype=torch.float64, requires_grad=True)
    v = (3 * torch.randn(2, 2, 8, 3, generator=g, dtype=torch.float64)).requires_grad_()
    out, want = laser_attention(q, k, v, mask=causal(), backend=backend), oracle(q, k, v, True)
    torch.testing.assert_close(out, want, **TOL)
    w = torch.randn_like(want)
    for a, e in zip(torch.autograd.grad((out * w).sum(), [q, k, v]), torch.autograd.grad((want * w).sum(), [q, k, v]),
                    strict=True):
        torch.testing.assert_close(a, e, **TOL)


def test_large_values_do_not_overflow():
    q, k = torch.randn(2, 1, 2, 6, 4).unbind(0)
    v = torch.randn(1, 2, 6, 3) + 200.0  # exp(200) overflows float32; the shifted form does not
    out = laser_attention(q, k, v)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), oracle(q.double(), k.double(), v.double(), False), rtol=0, atol=1e-4)


def test_unbatched_inputs():
    q, k, v = torch.randn(3, 6, 4, dtype=torch.float64).unbind(0)
    want = oracle(q[None, None], k[None, None], v[None, None], False)[0, 0]
    torch.testing.assert_close(laser_attention(q, k, v), want, **TOL)
