"""The chunks of a paged cache the split-KV path reads: every sequence's positions ``[start, stop)``, copied.

A chunk is gathered from the pool's pages (whole pages with ``index_select``) or sliced from a
contiguous cache, into a token-major tensor ``(B, c, H_kv, E)`` zeroed past each sequence's
length: the same bytes in the same layout wherever the pages lie, so what is computed on it is
the same bit for bit (:mod:`.selected`, path ``paged-split-kv``).

Without autograd every chunk runs on torch's fused CPU kernel (:func:`fused_pages`) with the
query heads of one key/value head as rows of one product, ``q (B, H_kv, g Lq, D)``
(Ainslie et al. 2023, grouped-query attention: the ``g`` heads of a group read the same
keys, so the chunk is read once per group), and with no mask at all where every query sees
every key of the chunk: such a chunk of whole pages costs two ``index_select`` copies and the
kernel, nothing else (the page lists and buffer views are made once per call). Chunks with
masked keys (a sequence ends inside, or the caller's mask cuts it) get a float mask
(:func:`fused_chunk`). The outputs and lse are checked as the fast lane checks them
(:func:`.lane.trusted`: a row torch zeroed, an overflow, a leaked NaN), every unmasked chunk
in one reduction, and only a chunk that fails runs on the exact split. Quantized pages
(``k_scale=``/``v_scale=``) are gathered as codes, with their scales, and only the chunk is
dequantized (:func:`attnkit.functional.quantize.dequantize`).
"""

from __future__ import annotations

import math
import threading

import torch

from ..functional.quantize import dequantize
from ..functional.validate import Problem
from . import rules
from .lane import trusted
from .pipeline import Workspace

__all__ = ["page_table", "page_split", "chunk_is_open", "fused_chunk", "fused_pages", "merge_stacked", "workspace"]

_NEG_INF = float("-inf")
_HELD = threading.local()  # per thread: the chunk buffers of the last calls, by dtype and device


def workspace(like: torch.Tensor) -> Workspace:
    """The chunk buffers of this thread for ``like``'s dtype and device, kept from call to call.

    A decoding step copies a few MB of pages per chunk; buffers made afresh by every call are
    returned to the OS and page-faulted in again by the next one, which costs more than the
    copy. So they are kept: at most the two largest chunks' keys and values per dtype and
    device (``SPLIT_KEYS`` positions of every sequence).
    """
    spaces = _HELD.__dict__.setdefault("spaces", {})
    key = (like.dtype, like.device)
    if key not in spaces:
        spaces[key] = Workspace(like)
    return spaces[key]


def page_table(p: Problem) -> torch.Tensor | None:
    """The page table on the queries' device, every entry a page of the pool (entries past a sequence's pages are
    never read; they are clamped so that a copy may still touch them): made once per call, sliced by every chunk.
    None for a contiguous cache."""
    sel = p.mask.selection
    if not sel.pooled:
        return None
    return sel.table.to(p.q.device).clamp(0, p.k.shape[2] // sel.block_size - 1)


def _positions(p: Problem, t: torch.Tensor, start: int, stop: int, space: Workspace | None = None,
               name: str = "", table: torch.Tensor | None = None) -> torch.Tensor:
    """Positions ``[start, stop)`` of every sequence of ``t`` ``(B, H_kv, Lk, E)`` (a pool's expanded view, or a
    contiguous cache), token-major: ``(B, c, H_kv, E)``; whole pages copied with ``index_select`` (into
    ``space``'s buffer ``name`` when given and of ``t``'s dtype; ``table``: :func:`page_table`, made anew when
    None)."""
    sel, c, ps = p.mask.selection, stop - start, p.mask.selection.block_size
    if not sel.pooled:
        return t[:, :, start:stop].transpose(1, 2)
    pool = t[0].transpose(0, 1)  # (P ps, H_kv, E): the pool the expanded view was made of
    rows = pool.reshape(-1, ps * pool.shape[1] * pool.shape[2])  # one row per page
    first = start // ps
    table = page_table(p) if table is None else table
    assert table is not None  # a pooled selection has one
    pages = table[:, first:-(-stop // ps)].flatten()
    if space is not None:
        chunk = torch.index_select(rows, 0, pages, out=space.take(name + "-pages", len(pages), rows.shape[1]))
    else:
        chunk = rows.index_select(0, pages)
    chunk = chunk.view(p.sizes[0], -1, *pool.shape[1:])  # (B, pages ps, H_kv, E)
    skip = start - first * ps
    if skip or chunk.shape[1] != c:  # part of a page: copied out, in the layout of a whole chunk
        chunk = chunk[:, skip:skip + c]
    return chunk


def page_split(p: Problem, start: int, stop: int, dtype, shortest: int, space: Workspace | None = None,
               table: torch.Tensor | None = None):
    """Positions ``[start, stop)`` of every sequence: keys and values ``(B, H_kv, c, E)`` (views of token-major
    copies), which are real ``(B, 1, 1, c)`` (None when every one is), and the positions.

    Whole pages of a pool are copied with ``index_select`` (a contiguous cache is sliced); either way the
    chunk is a token-major tensor zeroed past each sequence's length (``shortest``: the least length), the
    same bytes in the same layout wherever the pages lie, so the arithmetic on it is the same bit for bit.
    Without autograd the copies go to ``space``'s buffers, reused by every chunk (fresh copies of a few MB
    are page-faulted in anew each time, which costs more than the copy). ``table``: :func:`page_table`, when made.
    """
    sel, dev = p.mask.selection, p.q.device
    batch, c = p.sizes[0], stop - start
    pos = torch.arange(start, stop, device=dev)
    valid = pos < sel.lengths.to(dev)[:, None] if stop > shortest else None  # (B, c)
    quant = p.quant
    out = []
    for name, t in (("k", p.k), ("v", p.v)):
        chunk = _positions(p, t, start, stop, space if quant is None and t.dtype == dtype else None, name, table)
        copied = sel.pooled
        if quant is not None:  # codes: this chunk's alone dequantized, with its scales read the same way
            scale = quant.k_scale if name == "k" else quant.v_scale
            rows = scale if scale.dim() == 0 else _positions(p, scale[..., None], start, stop, table=table)[..., 0]
            chunk, copied = dequantize(chunk, rows, dtype), True
        elif not chunk.is_contiguous() or chunk.dtype != dtype:
            target = space.take(name, batch, c, *chunk.shape[2:]) if space is not None else None
            chunk, copied = target.copy_(chunk) if target is not None else chunk.to(dtype).contiguous(), True
        if valid is not None:  # a sequence ends inside this chunk: nothing stored past it is read
            fill = chunk.masked_fill_ if copied else chunk.masked_fill  # never in place on the caller's cache
            chunk = fill(~valid[:, :, None, None], 0.0)
        out.append(chunk.transpose(1, 2))
    return out[0], out[1], None if valid is None else valid[:, None, None, :], pos


def chunk_is_open(p: Problem, start: int, stop: int, r0: int, r1: int, shortest: int, longest: int) -> bool:
    """Whether every query ``[r0, r1)`` of every sequence sees every key ``[start, stop)``: no sequence ends
    inside the chunk and the caller's mask (a band, read from its ``band_terms``: ``lo <= j - i <= hi`` with
    bounds linear in the sequence's length) cuts none of it. False when that cannot be told from sizes."""
    if stop > shortest:
        return False
    within = p.mask.selection.within
    if within is None:
        return True
    if within.band_terms is None or within.uses & {"b", "h"}:
        return False
    lq = p.sizes[2]
    los, his = within.band_terms

    def bound(terms, pick):  # over every length: linear in it, so the extreme is at the least or the most
        return pick(c + s * (n - lq) for c, s in terms for n in (shortest, longest))
    lo_ok = not los or bound(los, max) <= start - (r1 - 1)
    hi_ok = not his or bound(his, min) >= (stop - 1) - r0
    return lo_ok and hi_ok


def fused_chunk(p: Problem, r0: int, r1: int, start: int, stop: int, q: torch.Tensor, shortest: int, longest: int,
                space: Workspace | None, table: torch.Tensor | None = None):
    """Keys ``[start, stop)`` for queries ``[r0, r1)`` on torch's fused kernel: ``(out (B, H_kv, g c, Dv),
    lse (B, H_kv, g c))`` with the ``g`` query heads of each key/value head as rows ``(g, i)``; None when the
    kernel's answer on a chunk with masked keys cannot be trusted (then the exact split runs)."""
    assert rules.FLASH is not None  # the fused path runs only where torch has the kernel
    k_g, v_g, valid, where = page_split(p, start, stop, q.dtype, shortest, space, table)  # (B, H_kv, n, E)
    batch, hq, _, d = q.shape
    hkv, c = k_g.shape[1], r1 - r0
    g, dev = hq // hkv, q.device
    q_c = q[:, :, r0:r1].reshape(batch, hkv, g * c, d)
    if chunk_is_open(p, start, stop, r0, r1, shortest, longest):  # no float mask; still a row torch zeroed or
        out, lse = rules.FLASH(q_c, k_g, v_g, 0.0, False, scale=p.scale)[:2]  # an overflow: the exact split
        return (out, lse) if trusted(out, lse) else None
    sel = p.mask.selection
    allowed = torch.ones(batch, 1, 1, stop - start, dtype=torch.bool, device=dev) if valid is None else valid
    if sel.within is not None:
        q_idx = torch.arange(r0, r1, device=dev).view(1, 1, -1, 1)
        allowed = allowed & sel.within.allows(torch.arange(batch, device=dev).view(-1, 1, 1, 1),
                                              torch.zeros(1, 1, 1, 1, dtype=torch.long, device=dev), q_idx,
                                              where.view(1, 1, 1, -1), p.sizes[2],
                                              sel.lengths.to(dev).view(-1, 1, 1, 1))
    allowed = allowed.expand(batch, 1, c, allowed.shape[-1])  # (B, 1, c, n)
    rows = allowed[:, :, None].expand(batch, 1, g, c, allowed.shape[-1]).reshape(batch, 1, g * c, -1)
    float_mask = torch.zeros(rows.shape, dtype=q.dtype, device=dev).masked_fill_(~rows, _NEG_INF)
    out, lse = rules.FLASH(q_c, k_g, v_g, 0.0, False, attn_mask=float_mask, scale=p.scale)[:2]
    has = rows.any(-1)  # (B, 1, g c)
    if not bool(torch.isfinite(torch.where(has, out.sum(-1) + lse, 0.0)).all()) or bool((has & (lse == 0)).any()):
        return None  # NaN, inf or a row torch zeroed (an lse of exactly 0 on a row with keys): the exact split
    return out.masked_fill(~has[..., None], 0.0), lse.masked_fill(~has, _NEG_INF)


def _page_copier(p: Problem, dtype, step: int, extent: int, space: Workspace, table: torch.Tensor | None):
    """For a full-precision pool of ``dtype`` and chunks of whole pages (``step`` a multiple of the page size): a
    function ``(start) -> (k, v)`` copying the pages of the whole chunk ``[start, start + step)`` into buffers
    taken once per call, with the pages of every whole chunk listed once, so that a chunk costs its two copies
    and nothing else (each small operator costs microseconds, more right after the kernel has streamed a chunk
    through the caches). The same bytes in the same layout as :func:`page_split`'s. None otherwise."""
    sel = p.mask.selection
    ps = sel.block_size
    whole = extent // step
    if table is None or p.quant is not None or p.k.dtype != dtype or p.v.dtype != dtype or step % ps or not whole:
        return None
    batch, per = p.sizes[0], step // ps
    pools = [t[0].transpose(0, 1) for t in (p.k, p.v)]  # (P ps, H_kv, E): the pools the expanded views were made of
    rows = [pool.reshape(-1, ps * pool.shape[1] * pool.shape[2]) for pool in pools]  # one row per page
    bufs = [space.take(name + "-pages", batch * per, r.shape[1]) for name, r in zip("kv", rows, strict=True)]
    views = [buf.view(batch, step, *pool.shape[1:]).transpose(1, 2) for buf, pool in zip(bufs, pools, strict=True)]
    pages = table[:, :whole * per].reshape(batch, whole, per).transpose(0, 1).reshape(whole, batch * per).unbind(0)

    def copy(start: int):
        for r, buf in zip(rows, bufs, strict=True):
            torch.index_select(r, 0, pages[start // step], out=buf)
        return views
    return copy


def fused_pages(p: Problem, r0: int, r1: int, extent: int, step: int, q: torch.Tensor, shortest: int, longest: int,
                exact) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Every split of the first ``extent`` positions (``step`` each) for queries ``[r0, r1)`` on torch's fused
    kernel, stacked: ``(outs (n, B, H_kv, g c, Dv), lses (n, B, H_kv, g c), empty_rows)``, for one merge;
    ``empty_rows`` is False when a chunk every query sees whole gave every row a finite lse.

    The page table is read once (:func:`page_table`) and the copies go to this thread's buffers
    (:func:`workspace`). A chunk every query sees whole runs with no mask, and the answers of all
    such chunks are checked together, as :func:`.lane.trusted` checks one (one reduction, one sync
    for the call, not one per chunk); a chunk with masked keys runs as :func:`fused_chunk`; a chunk
    whose answer cannot be trusted runs as ``exact(start, stop)`` (the exact split, in the same layout).
    """
    assert rules.FLASH is not None  # the fused path runs only where torch has the kernel
    space, table = workspace(q), page_table(p)
    batch, hq, _, d = q.shape
    hkv = p.k.shape[1]
    q_c = q[:, :, r0:r1].reshape(batch, hkv, hq // hkv * (r1 - r0), d)
    copy = _page_copier(p, q.dtype, step, extent, space, table)
    pieces: list[tuple[torch.Tensor, torch.Tensor]] = []
    opened: list[int] = []
    for start in range(0, extent, step):
        stop = min(extent, start + step)
        if chunk_is_open(p, start, stop, r0, r1, shortest, longest):  # no mask: its answer checked below
            k_g, v_g = copy(start) if copy is not None and stop - start == step else page_split(
                p, start, stop, q.dtype, shortest, space, table)[:2]
            opened.append(len(pieces))
            pieces.append(tuple(rules.FLASH(q_c, k_g, v_g, 0.0, False, scale=p.scale)[:2]))
        else:
            pieces.append(fused_chunk(p, r0, r1, start, stop, q, shortest, longest, space, table)
                          or exact(start, stop))
    outs, lses = torch.stack([out for out, _ in pieces]), torch.stack([lse for _, lse in pieces])
    if opened:  # each chunk's output sums plus lse / lse: NaN or inf for a leak, an overflow or a row torch zeroed
        sums = torch.addcdiv(outs.sum(-1), lses, lses).flatten(1).sum(1).tolist()
        bad = [i for i in opened if not math.isfinite(sums[i])]
        for i in bad:
            start = i * step
            outs[i], lses[i] = exact(start, min(extent, start + step))
    return outs, lses, not opened


def merge_stacked(outs: torch.Tensor, lses: torch.Tensor, empty_rows: bool = True, want_lse: bool = True):
    """Partials of disjoint key sets stacked on dim 0, ``outs (n, ..., E)`` and ``lses (n, ...)``, merged in one
    step: ``lse = log sum_c exp lse_c``, ``out = sum_c exp(lse_c - lse) out_c``; ``empty_rows=False`` when some
    partial is known to give every row a finite lse (no row has no key: no guard needed, and the weights are
    the softmax of the partials' lse, one operator); the merged lse is None unless ``want_lse``."""
    if outs.shape[0] == 1:
        return outs[0], lses[0]
    if not empty_rows:
        out = (torch.softmax(lses, 0).unsqueeze(-1) * outs).sum(0)
        return out, torch.logsumexp(lses, 0) if want_lse else None
    lse = torch.logsumexp(lses, 0)
    safe = torch.where(lse == _NEG_INF, 0.0, lse)  # no key anywhere: every weight 0
    weights = torch.exp_(lses - safe).unsqueeze(-1)
    return (outs * weights).sum(0), lse
