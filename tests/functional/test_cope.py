"""CoPE against a float64 transcription of its equations (Golovneva et al. 2024, arXiv:2405.18719, eq. 3-5)."""

import math

import pytest
import torch

from attnkit.errors import ShapeError
from attnkit.functional.cope import cope_attention

TOL = dict(rtol=0, atol=1e-10)


def oracle(q, k, v, e):
    """Per query i and key j <= i: p = sum_{t=j}^{i} sigmoid(s q_i.k_t), clamped; e(p) interpolated between the
    embeddings at floor and ceil; logit s q_i.(k_j + e(p)); softmax; every sum a loop."""
    b, h, n, d = q.shape
    groups, s = h // k.shape[1], d ** -0.5
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    for head in range(h):
        kh, vh = k[:, head // groups], v[:, head // groups]
        for i in range(n):
            logits = []
            for j in range(i + 1):
                p = sum(torch.sigmoid(s * (q[:, head, i] * kh[:, t]).sum(-1)) for t in range(j, i + 1))
                p = p.clamp(max=e.shape[0] - 1)
                lo = torch.floor(p)
                emb = torch.stack([(p[x] - lo[x]) * e[math.ceil(p[x].item())] + (1 - p[x] + lo[x]) * e[int(lo[x])]
                                   for x in range(b)])
                logits.append(s * (q[:, head, i] * (kh[:, j] + emb)).sum(-1))
            weights = torch.stack(logits, -1).softmax(-1)  # (b, i + 1)
            out[:, head, i] = (weights[:, :, None] * vh[:, :i + 1]).sum(1)
    return out


@pytest.mark.parametrize("backend", ["reference", "chunked", "auto"])
@pytest.mark.parametrize("num_positions", [4, 12])  # 4: some counts clamped
def test_equals_the_equations_forward_and_backward(backend, num_positions):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 8, 5, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 2, 8, 5, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    e = torch.randn(num_positions, 5, generator=g, dtype=torch.float64, requires_grad=True)
    out, want = cope_attention(q, k, v, e, backend=backend), oracle(q, k, v, e)
    torch.testing.assert_close(out, want, **TOL)
    w = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad((out * w).sum(), [q, k, v, e]),
                    torch.autograd.grad((want * w).sum(), [q, k, v, e]), strict=True):
        torch.testing.assert_close(a, b, **TOL)


def test_the_embeddings_shape_is_checked():
    q = torch.randn(1, 2, 4, 3)
    with pytest.raises(ShapeError, match=r"positions must have shape \(P, D\) = \(P, 3\); got \(5, 4\)"):
        cope_attention(q, q, q, torch.zeros(5, 4))
