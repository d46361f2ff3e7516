"""L2-distance attention against a float64 transcription of its formula (Kim et al. 2021, arXiv:2006.04710)."""

import pytest
import torch

import attnkit
from attnkit.errors import ShapeError
from attnkit.functional.distance import l2_distance_attention
from attnkit.masks import causal

TOL = dict(rtol=0, atol=1e-10)


def oracle(q, k, v, scale, causal_mask=False):
    """softmax_j(-scale sum_d (q_id - k_jd)^2) v_j, each distance summed from its differences, heads grouped."""
    groups = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    distances = (q[:, :, :, None, :] - kk[:, :, None, :, :]).square().sum(-1)
    scores = -scale * distances
    if causal_mask:
        lq, lk = scores.shape[-2:]
        scores = scores.masked_fill(~torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq), float("-inf"))
    return scores.softmax(-1) @ vv


@pytest.mark.parametrize("backend", ["reference", "chunked", "auto"])
@pytest.mark.parametrize("masked", [False, True])
def test_equals_the_distance_formula_forward_and_backward(backend, masked):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 9, 5, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 2, 13, 5, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    out = l2_distance_attention(q, k, v, scale=0.3, mask=causal() if masked else None, backend=backend)
    want = oracle(q, k, v, 0.3, masked)
    torch.testing.assert_close(out, want, **TOL)
    w = torch.randn_like(want)
    for a, e in zip(torch.autograd.grad((out * w).sum(), [q, k, v]), torch.autograd.grad((want * w).sum(), [q, k, v]),
                    strict=True):
        torch.testing.assert_close(a, e, **TOL)


def test_long_inputs_run_on_a_fused_or_chunked_path_not_the_dense_one():
    q, k, v = torch.randn(3, 1, 2, 600, 8, dtype=torch.float64).unbind(0)
    augmented = torch.cat([2 * q, -torch.ones_like(q[..., :1])], -1), torch.cat([k, k.square().sum(-1, True)], -1)
    explained = attnkit.explain(*augmented, v, mask=causal(), score="dot", scale=8 ** -0.5)
    assert explained.backend != "reference"  # the augmented dot product: a fused or O(L)-memory path
    out = l2_distance_attention(q, k, v, mask=causal())
    torch.testing.assert_close(out, oracle(q, k, v, 8 ** -0.5, True), **TOL)


def test_three_dimensional_inputs_are_refused_by_name():
    with pytest.raises(ShapeError, match="q and k must be 4-D tensors"):
        l2_distance_attention(torch.randn(2, 3, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 4))
