"""Talking-heads attention against a float64 transcription of its formula (Shazeer et al. 2020, arXiv:2003.02436)."""

import pytest
import torch

from attnkit.errors import ShapeError
from attnkit.functional.talking_heads import talking_heads_attention
from attnkit.masks import causal

TOL = dict(rtol=0, atol=1e-10)


def oracle(q, k, v, pre, post, scale, masked):
    """L_h = sum_g P_hg scale q_g k_g^T; W = softmax(L); O_h = sum_g Q_hg W_g v_h, every sum written out."""
    h = q.shape[1]
    logits = torch.stack([q[:, g] @ k[:, g].transpose(-1, -2) * scale for g in range(h)], 1)  # (B, H, Lq, Lk)
    if pre is not None:
        logits = torch.stack([sum(pre[i, g] * logits[:, g] for g in range(h)) for i in range(h)], 1)
    if masked:
        lq, lk = logits.shape[-2:]
        logits = logits.masked_fill(~torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq), float("-inf"))
    weights = logits.softmax(-1)
    if post is not None:
        weights = torch.stack([sum(post[i, g] * weights[:, g] for g in range(h)) for i in range(h)], 1)
    return weights @ v


@pytest.mark.parametrize(("use_pre", "use_post"), [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("backend", ["reference", "chunked", "auto"])
def test_equals_the_formula_forward_and_backward(use_pre, use_post, backend):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 7, 4, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, 3, 9, d, generator=g, dtype=torch.float64, requires_grad=True) for d in (4, 5))
    pre = torch.randn(3, 3, generator=g, dtype=torch.float64, requires_grad=True) if use_pre else None
    post = torch.randn(3, 3, generator=g, dtype=torch.float64, requires_grad=True) if use_post else None
    out = talking_heads_attention(q, k, v, pre=pre, post=post, mask=causal(), backend=backend)
    want = oracle(q, k, v, pre, post, 0.5, True)
    torch.testing.assert_close(out, want, **TOL)
    leaves = [t for t in (q, k, v, pre, post) if t is not None]
    w = torch.randn_like(want)
    for a, e in zip(torch.autograd.grad((out * w).sum(), leaves), torch.autograd.grad((want * w).sum(), leaves),
                    strict=True):
        torch.testing.assert_close(a, e, **TOL)


def test_identity_mixes_are_plain_attention():
    q, k, v = torch.randn(3, 2, 4, 6, 5, dtype=torch.float64).unbind(0)
    eye = torch.eye(4, dtype=torch.float64)
    torch.testing.assert_close(talking_heads_attention(q, k, v, pre=eye, post=eye), oracle(q, k, v, None, None,
                                                                                          5 ** -0.5, False), **TOL)


def test_mixes_of_the_wrong_shape_or_grouped_keys_are_refused():
    q, k, v = torch.randn(3, 2, 4, 6, 5).unbind(0)
    with pytest.raises(ShapeError, match=r"pre must be a tensor of shape \(H, H\) = \(4, 4\); got \(3, 3\)"):
        talking_heads_attention(q, k, v, pre=torch.eye(3))
    with pytest.raises(ShapeError, match="k and v must have the query heads H = 4"):
        talking_heads_attention(q, k[:, :2], v[:, :2], post=torch.eye(4))
