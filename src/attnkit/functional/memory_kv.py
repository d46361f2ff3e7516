"""Persistent memory key-values: learned keys and values that every query can attend to, before the sequence's."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ShapeError
from ..masks.base import Mask

__all__ = ["memory_kv_attention"]


def memory_kv_attention(q, k, v, memory_k, memory_v, *, mask=None, **options):
    """Attention over ``[memory_k; k]`` and ``[memory_v; v]``, the memory visible to every query.

    Sukhbaatar et al. 2019, "Augmenting Self-attention with Persistent Memory", arXiv:1907.01470,
    eq. 5-6 (x-transformers' ``num_mem_kv``): ``M`` learned key/value pairs per key head, shared by
    every sequence and position, are concatenated before the keys and values; a mask written for
    the ``Lk`` sequence keys restricts only those. A causal mask keeps its lazy form (aligned
    bottom-right, query ``i`` sees the ``M`` memory keys and sequence keys ``<= i``), so the call
    keeps every fast path; any other mask is materialised with the memory columns allowed.

    Differences from the paper: none (the paper adds the memory to every head of a layer without
    feed-forward sublayer; that is the model's choice).

    Shapes: ``q`` ``(B, H, Lq, D)``, ``k`` ``(B, Hkv, Lk, D)``, ``v`` ``(B, Hkv, Lk, Dv)``, ``memory_k``
    ``(Hkv, M, D)``, ``memory_v`` ``(Hkv, M, Dv)`` -> ``(B, H, Lq, Dv)``; ``mask`` as
    :func:`attnkit.attention` for the ``Lq x Lk`` sequence part; other keywords as there.

    Example:
        >>> import torch
        >>> from attnkit import masks
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)
        >>> out = memory_kv_attention(q, k, v, torch.zeros(2, 0, 4), torch.zeros(2, 0, 4), mask=masks.causal())
        >>> torch.allclose(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6)
        True
    """
    from ..core import attention

    who = "memory_kv_attention"
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        raise ShapeError(f"{who}: q, k and v must be 4-D tensors (B, H, L, D); got "
                         f"{[tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__ for t in (q, k, v)]}")
    b, hkv, lk = k.shape[:3]
    for name, t, x in (("memory_k", memory_k, k), ("memory_v", memory_v, v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.shape[0] != hkv or t.shape[2] != x.shape[3]:
            raise ShapeError(f"{who}: {name} must have shape (Hkv, M, {x.shape[3]}) with Hkv = {hkv}; got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    m = memory_k.shape[1]
    if memory_v.shape[1] != m:
        raise ShapeError(f"{who}: memory_v must hold the M = {m} slots of memory_k; got {memory_v.shape[1]}")
    keys = torch.cat([memory_k.to(k.dtype).expand(b, -1, -1, -1), k], 2)
    values = torch.cat([memory_v.to(v.dtype).expand(b, -1, -1, -1), v], 2)
    if isinstance(mask, Mask) and not (mask.kind == "causal" and getattr(mask, "align", None) == "bottom_right"):
        mask = mask.materialize(q.shape[2], lk, batch=b, heads=q.shape[1], device=q.device)
    if isinstance(mask, torch.Tensor):
        mask = F.pad(mask, (m, 0), value=True)  # the memory columns, allowed for every query
    return attention(q, keys, values, mask=mask, **options)
