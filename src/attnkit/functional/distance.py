"""Attention on negative squared L2 distances, run as a dot product in one more dimension (any exact path)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["l2_distance_attention"]


def l2_distance_attention(q, k, v, *, scale=None, **options):
    """``softmax(-scale |q_i - k_j|^2 + bias, mask) v``: scores by distance instead of by dot product.

    Kim et al. 2021, "The Lipschitz Constant of Self-Attention", ICML 2021, arXiv:2006.04710, eq. 2
    (L2 self-attention; x-transformers' ``use_l2_distance``). Since
    ``-|q_i - k_j|^2 = 2 q_i^T k_j - |k_j|^2 - |q_i|^2`` and a term constant along a row does not
    change its softmax, the weights are those of the dot product of ``q'_i = [2 q_i, -1]`` with
    ``k'_j = [k_j, |k_j|^2]`` (``D + 1`` features): :func:`attnkit.attention` then runs it on whichever
    exact path serves that call (torch's fused kernels, the O(L)-memory chunked paths), with every
    mask, bias, sink and grouped-key option as there. Values as wide as the queries get a zero
    column too (dropped after), so that the fused kernel, which needs ``Dv == D``, takes the call.

    Differences from the paper: none in the weights; ``scale`` defaults to ``D^-1/2`` (the paper
    divides by ``sqrt(D / H)`` per head, the same). An lse asked for (``return_lse``) is that of the
    augmented scores, ``scale |q_i|^2`` above the distances'.

    Shapes: as :func:`attnkit.attention` with 4-D ``q, k, v`` ``(B, H, Lq, D)``, ``(B, Hkv, Lk, D)``,
    ``(B, Hkv, Lk, Dv)`` -> ``(B, H, Lq, Dv)``.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)
        >>> want = torch.softmax(-torch.cdist(q, k) ** 2 / 2, -1) @ v
        >>> torch.allclose(l2_distance_attention(q, k, v), want, atol=1e-5)
        True
    """
    from ..core import attention
    from ..errors import ShapeError

    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k)):
        raise ShapeError("l2_distance_attention: q and k must be 4-D tensors (B, H, L, D); got "
                         f"{[tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in (q, k)]}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    qa = F.pad(2 * q, (0, 1), value=-1.0)  # [2 q, -1]
    ka = torch.cat([k, k.square().sum(-1, keepdim=True)], -1)  # [k, |k|^2]
    if v.shape[-1] != q.shape[-1]:
        return attention(qa, ka, v, score="dot", scale=scale, **options)
    # Values as wide as the queries, [v, 0]: torch's fused kernel takes Dv == D only (else its dense math path)
    res = attention(qa, ka, F.pad(v, (0, 1)), score="dot", scale=scale, **options)
    if isinstance(res, torch.Tensor):
        return res[..., :-1]
    return res._replace(output=res.output[..., :-1])
