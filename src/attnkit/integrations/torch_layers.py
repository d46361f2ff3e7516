"""Fitting :class:`~attnkit.nn.multihead.MultiHeadAttention` into torch's Transformer layers as their ``self_attn``.

In eval without autograd, torch's ``TransformerEncoderLayer`` and ``TransformerEncoder``
take a "fast path" that reads their attention module's attributes instead of calling it:

1. ``TransformerEncoderLayer`` computes the whole layer in one fused call
   (``torch._transformer_encoder_layer_fwd``) from ``self_attn.in_proj_weight`` and friends,
   after ``self_attn.merge_masks``. That is torch's attention, not the module's: it would
   bypass attnkit (its kernels, its ``mask=``), and torch's packed layout is wrong for
   grouped-query heads. The layer skips the fused call whenever a forward hook is attached
   to one of its submodules (torch's own rule: hooks must see the call), so
   :func:`decline_fused_layer` attaches a pre-hook that changes nothing. The layer then
   calls the module, and ``merge_masks`` is never needed.
2. ``TransformerEncoder`` (``enable_nested_tensor=True``, its default) packs a padded batch
   into a nested tensor before its layers and unpacks the result after them; each layer's
   ``self_attn`` then receives nested ``query``/``key``/``value`` and no padding mask.
   :func:`unnest` pads them again and builds the key-padding mask from the lengths;
   :func:`renest` packs the output like the query.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ..errors import ArgumentError, ShapeError

__all__ = ["decline_fused_layer", "Unnested", "is_nested", "unnest", "renest"]


def _leave_torch_layers_unfused(module: nn.Module, args) -> None:
    """A forward pre-hook that changes nothing: its presence makes torch's layers call the module."""
    return None


def decline_fused_layer(module: nn.Module) -> None:
    """Make torch's ``TransformerEncoderLayer`` call ``module`` instead of its fused C++ layer (see above)."""
    if _leave_torch_layers_unfused not in module._forward_pre_hooks.values():
        module.register_forward_pre_hook(_leave_torch_layers_unfused)


class Unnested(NamedTuple):
    """Nested inputs as padded ``(N, L, E)`` tensors, the key-padding mask (True = padding) and the query lengths."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    key_padding_mask: torch.Tensor
    query_lengths: list[int]
    layout: torch.layout


def is_nested(*tensors) -> bool:
    return any(getattr(t, "is_nested", False) for t in tensors)


def _lengths(t: torch.Tensor) -> list[int]:
    return [row.shape[0] for row in t.unbind()]


def unnest(who: str, module, query, key, value, *, key_padding_mask, attn_mask, need_weights) -> Unnested:
    """Nested ``(N, *, E)`` query, key and value (batch first) as padded tensors and a key-padding mask.

    The nested tensors carry the padding themselves, so no ``key_padding_mask`` or
    ``attn_mask`` may come with them (as in torch), and weights are not returned for them.
    """
    tensors = {"query": query, "key": key, "value": value}
    if not all(getattr(t, "is_nested", False) for t in tensors.values()):
        flags = ", ".join(f"{name} {getattr(t, 'is_nested', False)}" for name, t in tensors.items())
        raise ShapeError(f"{who}: query, key and value must all be nested tensors or none; got nested: {flags}")
    if not module.batch_first or any(t.dim() != 3 for t in tensors.values()):
        raise ShapeError(f"{who}: nested inputs must be (N, *, E) with batch_first=True; got batch_first="
                         f"{module.batch_first} and dims {[t.dim() for t in tensors.values()]}")
    if key_padding_mask is not None or attn_mask is not None or need_weights:
        raise ArgumentError(f"{who}: nested inputs carry their own padding: key_padding_mask and attn_mask must be "
                            f"None and need_weights False; got key_padding_mask "
                            f"{'a tensor' if key_padding_mask is not None else None}, attn_mask "
                            f"{'a tensor' if attn_mask is not None else None}, need_weights={need_weights}")
    key_lengths = _lengths(key)
    if _lengths(value) != key_lengths:
        raise ShapeError(f"{who}: key and value must have the same lengths; got {key_lengths} and {_lengths(value)}")
    padded = {id(t): t.to_padded_tensor(0.0) for t in tensors.values()}  # q is k is v: pad once
    q, k, v = (padded[id(t)] for t in tensors.values())
    positions = torch.arange(k.shape[1], device=k.device)
    padding = positions >= torch.tensor(key_lengths, device=k.device)[:, None]  # (N, S), True = padding
    return Unnested(q, k, v, padding, _lengths(query), query.layout)


def renest(out: torch.Tensor, unnested: Unnested) -> torch.Tensor:
    """The padded ``(N, L, E)`` output as a nested tensor with the query's lengths and layout."""
    rows = [row[:n] for row, n in zip(out, unnested.query_lengths, strict=True)]
    return torch.nested.as_nested_tensor(rows, layout=unnested.layout)
