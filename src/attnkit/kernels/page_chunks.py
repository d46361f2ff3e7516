"""The chunks of a paged cache the split-KV path reads: every sequence's positions ``[start, stop)``, copied.

A chunk is gathered from the pool's pages (whole pages with ``index_select``) or sliced from a
contiguous cache, into a token-major tensor ``(B, c, H_kv, E)`` zeroed past each sequence's
length: the same bytes in the same layout wherever the pages lie, so what is computed on it is
the same bit for bit (:mod:`.selected`, path ``paged-split-kv``). Quantized pages
(``k_scale=``/``v_scale=``) are gathered as codes, with their scales, and only the chunk is
dequantized (:func:`attnkit.functional.quantize.dequantize`).
"""

from __future__ import annotations

import torch

from ..functional.quantize import dequantize
from ..functional.validate import Problem
from .pipeline import Workspace

__all__ = ["page_split"]


def _positions(p: Problem, t: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Positions ``[start, stop)`` of every sequence of ``t`` ``(B, H_kv, Lk, E)`` (a pool's expanded view, or a
    contiguous cache), token-major: ``(B, c, H_kv, E)``; whole pages copied with ``index_select``."""
    sel, c, ps = p.mask.selection, stop - start, p.mask.selection.block_size
    if not sel.pooled:
        return t[:, :, start:stop].transpose(1, 2)
    pool = t[0].transpose(0, 1)  # (P ps, H_kv, E): the pool the expanded view was made of
    rows = pool.reshape(-1, ps * pool.shape[1] * pool.shape[2])  # one row per page
    first = start // ps
    pages = sel.table[:, first:-(-stop // ps)].to(p.q.device).clamp(0, rows.shape[0] - 1).flatten()
    chunk = rows.index_select(0, pages).view(p.sizes[0], -1, *pool.shape[1:])  # (B, pages ps, H_kv, E)
    skip = start - first * ps
    if skip or chunk.shape[1] != c:  # part of a page: copied out, in the layout of a whole chunk
        chunk = chunk[:, skip:skip + c]
    return chunk


def page_split(p: Problem, start: int, stop: int, dtype, shortest: int, space: Workspace | None = None):
    """Positions ``[start, stop)`` of every sequence: keys and values ``(B, H_kv, c, E)`` (views of token-major
    copies), which are real ``(B, 1, 1, c)``, and the positions.

    Whole pages of a pool are copied with ``index_select`` (a contiguous cache is sliced); either way the
    chunk is a token-major tensor zeroed past each sequence's length (``shortest``: the least length), the
    same bytes in the same layout wherever the pages lie, so the arithmetic on it is the same bit for bit.
    Without autograd the copies of parts of pages go to ``space``'s buffers, reused by every chunk.
    """
    sel, dev = p.mask.selection, p.q.device
    batch, c = p.sizes[0], stop - start
    pos = torch.arange(start, stop, device=dev)
    valid = pos < sel.lengths.to(dev)[:, None]  # (B, c)
    quant = p.quant
    out = []
    for name, t in (("k", p.k), ("v", p.v)):
        chunk = _positions(p, t, start, stop)  # (B, c, H_kv, E)
        if quant is not None:  # codes: this chunk's alone dequantized, with its scales read the same way
            scale = quant.k_scale if name == "k" else quant.v_scale
            rows = scale if scale.dim() == 0 else _positions(p, scale[..., None], start, stop)[..., 0]
            chunk = dequantize(chunk, rows, dtype)
        elif not chunk.is_contiguous() or chunk.dtype != dtype:
            target = space.take(name, batch, c, *chunk.shape[2:]) if space is not None else None
            chunk = target.copy_(chunk) if target is not None else chunk.to(dtype).contiguous()
        if stop > shortest:  # a sequence ends inside this chunk: nothing stored past it is read
            chunk = chunk.masked_fill_(~valid[:, :, None, None], 0.0)
        out.append(chunk.transpose(1, 2))
    return out[0], out[1], valid[:, None, None, :], pos
