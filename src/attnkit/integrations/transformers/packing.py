"""Packed sequences and sparse indexers' key choices, as the attention function reads them.

A row of packed documents reaches a layer either as transformers' packed-sequence mask (the
``position_ids`` restart at each document: :class:`~.model_masks.Packing`) or as the
FlashAttention keywords ``cu_seq_lens_q``/``cu_seq_lens_k`` (``DataCollatorWithFlattening(
return_flash_attn_kwargs=True)``) beside a whole-row causal, window or bidirectional mask. Either
way the layer runs :func:`attnkit.varlen_attn`: documents laid out on blocks, the block-sparse
paths, the layer's mask inside each document, never a ``T x T`` mask.

Sparse-attention indexers hand the attention their choice: ``indices`` ``(B, Lq, k)`` (top-k keys,
every head: DeepSeek-V3.2, GLM-MoE-DSA) or ``block_indices`` ``(B, H_idx, Lq, n)`` (top-n blocks of
the indexer's ``block_size`` keys, one choice per group of heads: MiniMax-M3). They become
:func:`attnkit.masks.selected_keys` / :func:`attnkit.masks.selected_blocks`, AND-ed with the
layer's mask, and the gathered path reads only the chosen keys.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ... import masks
from ...errors import UnsupportedFeature
from ...masks.base import Mask
from ...varlen import varlen_attn

__all__ = ["Documents", "documents", "attend_documents", "selection"]


class Documents(NamedTuple):
    """The documents of a packed row: cumulative lengths ``(N + 1,)``, the longest, the mask inside each."""

    cu: torch.Tensor
    longest: int
    within: Mask | None


def _inside_each(mask) -> bool:
    """A whole-row mask that means the same inside every document: none, or a band of the positions."""
    return mask is None or (isinstance(mask, Mask) and mask.uses <= {"q", "kv"} and mask.band_terms is not None)


def documents(model_mask, kwargs, query, key) -> Documents | None:
    """The documents of the call's one row (a whole row, no cache, no padding); None when it is not packed."""
    if query.shape[0] != 1 or query.shape[2] != key.shape[2] or model_mask.q_offset or model_mask.kv_offset:
        return None
    packed = model_mask.packing
    if packed is not None:
        lengths, within = torch.bincount(packed.ids), packed.within
    else:
        cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
        if cu_q is None or cu_k is None or not torch.equal(cu_q, cu_k) or not _inside_each(model_mask.mask):
            return None
        lengths, within = cu_q.long().diff(), model_mask.mask
    cu = torch.nn.functional.pad(torch.cumsum(lengths, 0), (1, 0))
    if not len(lengths) or int(cu[-1]) != query.shape[2]:
        return None
    return Documents(cu, int(lengths.max()), within)


def attend_documents(query, key, value, docs: Documents, *, scale, dropout: float, bias) -> torch.Tensor:
    """``(1, H, T, D)`` tensors attended document by document: ``(1, T, H, Dv)``."""
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (T, H, D)
    out = varlen_attn(q, k, v, docs.cu, docs.cu, docs.longest, docs.longest, scale=scale, enable_gqa=True,
                      dropout_p=dropout, mask=docs.within, bias=bias)
    return out[None]


def selection(module, kwargs, heads: int, name: str) -> Mask | None:
    """The keys a sparse indexer chose (``indices`` or ``block_indices``) as an attnkit mask; None without."""
    chosen, blocks = kwargs.get("indices"), kwargs.get("block_indices")
    if chosen is not None:
        return masks.selected_keys(chosen)
    if blocks is None:
        return None
    size = getattr(getattr(module, "indexer", None), "block_size", None)
    if not isinstance(size, int) or blocks.dim() != 4 or heads % blocks.shape[1]:
        raise UnsupportedFeature(f"{name} hands block_indices {tuple(blocks.shape)} without an indexer block_size "
                                 f"attnkit can read, or for heads that do not divide its {heads}; use "
                                 "attn_implementation='eager'")
    return masks.selected_blocks(blocks, size, group_size=heads // blocks.shape[1])
