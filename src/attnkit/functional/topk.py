"""Top-k sparse attention: each query keeps only its k highest-scoring keys."""

from __future__ import annotations

import torch

from ..errors import ArgumentError, ShapeError, check_int
from ..masks.base import Mask

__all__ = ["topk_attention"]


def topk_attention(q, k, v, top_k: int, *, mask=None, scale=None, **options):
    """``softmax`` over the ``top_k`` largest allowed scores of each row (the others masked), times ``v``.

    Zhao et al. 2019, "Explicit Sparse Transformer: Concentrated Attention Through Explicit
    Selection", arXiv:1912.11637, eq. 6-7 (x-transformers' ``sparse_topk``)::

        t_i = the top_k-th largest of {scale q_i^T k_j : j allowed};   M_ij = allowed_ij and scale q_i^T k_j >= t_i
        o_i = softmax_j(scale q_i^T k_j, M) v

    (a tie with ``t_i`` keeps every tied key, as x-transformers does). The selection is made from
    dense scores without gradients (it is piecewise constant); the attention then runs on whichever
    exact path serves a dense mask (torch's fused kernels), gradients through it as usual.

    Differences from the paper: none (a row with fewer than ``top_k`` allowed keys keeps them all).

    Shapes: ``q`` ``(B, H, Lq, D)``, ``k`` ``(B, Hkv, Lk, D)``, ``v`` ``(B, Hkv, Lk, Dv)`` -> ``(B, H, Lq, Dv)``;
    ``mask`` an :mod:`attnkit.masks` mask or a bool tensor as :func:`attnkit.attention`; ``scale``
    (default ``D^-1/2``) and the other keywords as there, but not ``bias`` or ``score`` (the
    selection reads the scaled dot products).

    Complexity: O(B H Lq Lk D) time and an ``Lq x Lk`` selection per head.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)
        >>> torch.allclose(topk_attention(q, k, v, 5), torch.nn.functional.scaled_dot_product_attention(q, k, v),
        ...                atol=1e-6)  # k = every key: dense attention
        True
    """
    from ..core import attention

    who = "topk_attention"
    check_int(who, "top_k", top_k, 1)
    for name in ("bias", "score"):
        if name in options:
            raise ArgumentError(f"{who}: {name} is not supported (the selection reads the scaled dot products); "
                                f"got {name}={options[name]!r}")
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k)):
        raise ShapeError(f"{who}: q and k must be 4-D tensors (B, H, L, D); got "
                         f"{[tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in (q, k)]}")
    b, h, lq, d = q.shape
    lk = k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    with torch.no_grad():
        acc = torch.promote_types(q.dtype, torch.float32)
        keys = k.to(acc).repeat_interleave(h // k.shape[1], 1)
        scores = q.to(acc) @ keys.transpose(-1, -2) * scale  # (B, H, Lq, Lk)
        allowed = mask.materialize(lq, lk, batch=b, heads=h, device=q.device) if isinstance(mask, Mask) else mask
        if allowed is not None:
            scores = scores.masked_fill(~allowed, float("-inf"))
        threshold = scores.topk(min(top_k, lk), -1).values[..., -1:]
        keep = scores >= threshold
        if allowed is not None:
            keep = keep & allowed
    return attention(q, k, v, mask=keep, scale=scale, **options)
