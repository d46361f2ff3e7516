"""Selective attention: a token that a later query selects is masked, softly, from the queries after that."""

from __future__ import annotations

import torch

from ..errors import ShapeError, check_int

__all__ = ["selective_attention"]


def selective_attention(q, k, v, *, selector_head: int = 0, scale=None, **options):
    """Causal self-attention whose logits are reduced by how strongly earlier queries selected each key.

    Leviathan et al. 2024, "Selective Attention Improves Transformer", arXiv:2410.02703, Alg. 1
    (x-transformers' ``selective``): one head's causal logits ``L^0`` give the selections
    ``S_tj = relu(L^0_tj)`` for ``j <= t``, with ``S_t0 = 0`` (the first token is never masked) and
    ``S_tt = 0`` (a token does not mask itself); query ``i`` then subtracts what the queries before
    it selected::

        F_ij = sum_{t < i} S_tj
        o_i  = sum_{j <= i} softmax_j(scale q_i^T k_j - F_ij) v_j          (every head)

    ``F`` needs the selecting head's whole ``L x L`` logits (a running sum over queries), so it is
    built densely and handed to :func:`attnkit.attention` as a bias, which runs the attention on the
    fastest exact path for a float bias (torch's fused kernel one slab of rows at a time);
    gradients reach the selecting head through ``F``.

    Differences from the paper: none.

    Shapes: ``q`` ``(B, H, L, D)``, ``k`` ``(B, Hkv, L, D)``, ``v`` ``(B, Hkv, L, Dv)`` (self-attention:
    as many queries as keys) -> ``(B, H, L, Dv)``; ``selector_head`` the query head whose logits
    select; ``scale`` (default ``D^-1/2``) and the other keywords as :func:`attnkit.attention`
    (the mask is causal).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 6, 4).unbind(0)
        >>> selective_attention(q, k, v).shape
        torch.Size([1, 2, 6, 4])
    """
    from ..core import attention
    from ..masks import causal

    who = "selective_attention"
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k)) or q.shape[2] != k.shape[2]:
        raise ShapeError(f"{who}: q and k must be 4-D tensors (B, H, L, D) with as many queries as keys; got "
                         f"{[tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in (q, k)]}")
    _, h, n, d = q.shape
    head = check_int(who, "selector_head", selector_head, 0)
    if head >= h:
        raise ShapeError(f"{who}: selector_head must be a query head in [0, {h}); got {head}")
    scale = d ** -0.5 if scale is None else scale
    acc = torch.promote_types(q.dtype, torch.float32)
    logits = q[:, head].to(acc) @ k[:, head // (h // k.shape[1])].to(acc).transpose(-1, -2) * scale  # (B, L, L)
    index = torch.arange(n, device=q.device)
    chosen = (index[None, :] < index[:, None]) & (index[None, :] > 0)  # [t, j]: j < t (not itself), j not the first
    selected = torch.relu(logits) * chosen
    earlier = torch.cat([torch.zeros_like(selected[:, :1]), selected[:, :-1]], 1).cumsum(1)  # F_ij: t < i
    return attention(q, k, v, mask=causal(), bias=-earlier[:, None], scale=scale, **options)
