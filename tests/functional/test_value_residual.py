"""Value residual against the ResFormer formula (Zhou et al. 2024, arXiv:2410.17897, eq. 6)."""

import pytest
import torch

import attnkit
from attnkit.errors import ShapeError
from attnkit.functional.value_residual import value_residual
from attnkit.masks import causal

TOL = dict(rtol=0, atol=1e-10)


@pytest.mark.parametrize("learned", [False, True])
def test_attention_over_mixed_values_equals_the_formula_forward_and_backward(learned):
    g = torch.Generator().manual_seed(0)
    q, k, v, first = (torch.randn(2, 3, 7, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(4))
    mix = torch.sigmoid(torch.randn(2, 3, 7, 1, generator=g, dtype=torch.float64)).requires_grad_() if learned else 0.3
    out = attnkit.attention(q, k, value_residual(v, first, mix), mask=causal())
    scores = (q @ k.transpose(-1, -2) / 2).masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), float("-inf"))
    lam = mix if learned else torch.tensor(0.3, dtype=torch.float64)
    want = scores.softmax(-1) @ (lam * v + (1 - lam) * first)
    torch.testing.assert_close(out, want, **TOL)
    leaves = [q, k, v, first] + ([mix] if learned else [])
    w = torch.randn_like(want)
    for a, e in zip(torch.autograd.grad((out * w).sum(), leaves), torch.autograd.grad((want * w).sum(), leaves),
                    strict=True):
        torch.testing.assert_close(a, e, **TOL)


def test_shapes_are_checked():
    with pytest.raises(ShapeError, match=r"first must have the values' shape \(1, 2, 3, 4\); got \(1, 2, 3, 5\)"):
        value_residual(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 5))
