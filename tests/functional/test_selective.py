"""Selective attention against a float64 transcription of its algorithm (Leviathan et al. 2024, arXiv:2410.02703)."""

import pytest
import torch

from attnkit.errors import ShapeError
from attnkit.functional.selective import selective_attention

TOL = dict(rtol=0, atol=1e-10)


def oracle(q, k, v, head):
    """F_ij = sum over t < i with 0 < j < t of relu(head's logit_tj); softmax_j<=i(logit_ij - F_ij), loops."""
    b, h, n, d = q.shape
    groups = h // k.shape[1]
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    sel = q[:, head] @ k[:, head // groups].transpose(-1, -2) * d ** -0.5
    for i in range(n):
        penalty = torch.stack([sum((torch.relu(sel[:, t, j]) for t in range(i) if 0 < j < t),
                                   torch.zeros(b, dtype=torch.float64)) for j in range(i + 1)], -1)  # (b, i + 1)
        for head_out in range(h):
            g = head_out // groups
            logits = q[:, head_out, i, None, :] @ k[:, g, :i + 1].transpose(-1, -2) * d ** -0.5  # (b, 1, i + 1)
            weights = (logits[:, 0] - penalty).softmax(-1)
            out[:, head_out, i] = (weights[:, :, None] * v[:, g, :i + 1]).sum(1)
    return out


@pytest.mark.parametrize("backend", ["reference", "chunked", "auto"])
@pytest.mark.parametrize("head", [0, 3])
def test_equals_the_algorithm_forward_and_backward(backend, head):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 9, 5, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 2, 9, 5, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out, want = selective_attention(q, k, v, selector_head=head, backend=backend), oracle(q, k, v, head)
    torch.testing.assert_close(out, want, **TOL)
    w = torch.randn_like(want)
    for a, e in zip(torch.autograd.grad((out * w).sum(), [q, k, v]), torch.autograd.grad((want * w).sum(), [q, k, v]),
                    strict=True):
        torch.testing.assert_close(a, e, **TOL)


def test_the_selecting_head_is_checked():
    q = torch.randn(1, 2, 4, 3)
    with pytest.raises(ShapeError, match=r"selector_head must be a query head in \[0, 2\); got 2"):
        selective_attention(q, q, q, selector_head=2)
