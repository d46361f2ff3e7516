"""Attention over selected keys: each query's (or each sequence's) keys gathered, long selections split.

A mask of kind ``"selected"`` (:mod:`attnkit.masks.selected`) names the key
blocks of every query: top-k keys or key blocks (DSA, NSA, MoBA), or the pages of a
sequence in a paged cache. Query ``i`` reads only its ``k = n * block_size`` keys::

    out_i = softmax(q_i K[S_i]^T * scale) V[S_i]        (S_i: the keys query i selected)

so the work is ``O(Lq k (D + Dv))``, whatever ``Lk``. Heads are computed in groups that
share a selection (``hx`` compute heads of ``gp`` query heads each: the heads of one index
head, or of one key/value head), so a selection shared by a grouped-query group is gathered
once. The gathered keys of invalid slots (-1, past a sequence's length) are zeroed, so
nothing stored there reaches the output or a gradient.

When one selection serves every query (a paged cache) the keys are split into chunks of
``SPLIT_KEYS`` positions in the sequence's order (split-KV): each chunk's partial output and
log-sum-exp are computed on gathered copies of that chunk only, never of the whole cache,
and merged by log-sum-exp,
``out = sum_c exp(lse_c - lse) out_c`` with ``lse = log sum_c exp(lse_c)``. Without autograd
the chunks run on torch's fused CPU kernel. The chunks are cut at logical positions, so the
arithmetic does not depend on where the pages lie: a permuted or forked pool gives the bits
of the same keys stored in order.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.utils.checkpoint import checkpoint

from ..functional.validate import Problem
from . import page_segments, rules, selected_decode, selected_pairs, selected_rows, selected_union
from .page_chunks import fused_pages, merge_stacked, page_split
from .path_cost import PathCost, Product, fused_attention, itemsize
from .pipeline import (
    KernelOutput,
    block_scores,
    block_weights,
    concat_pieces,
    dropout,
    join_sinks,
    row_chunks,
    without_sinks,
)

__all__ = ["Plan", "plan", "run", "cost", "density", "describe", "SPLIT_KEYS", "BUDGET"]

SPLIT_KEYS = 512  # keys per chunk of a selection every query shares (split-KV), merged by log-sum-exp
BUDGET = 1 << 25  # gathered elements (keys, values and scores) per chunk of queries
_NEG_INF = float("-inf")


class Plan(NamedTuple):
    """How a call is cut: compute heads, query rows per chunk, keys per split."""

    hx: int  # compute heads: the index heads or the key/value heads, whichever is finer
    gp: int  # query heads per compute head
    shared: bool  # one selection for every query: a chunk's queries are rows of one product
    rows: int  # queries per chunk
    keys: int  # keys per split (a multiple of the block size unless positions are logical)
    slots: int  # keys each query reads: n * block_size


def plan(p: Problem) -> Plan:
    sel = p.mask.selection
    batch, hq, lq, _, d, dv = p.sizes
    hkv, hs = p.k.shape[1], sel.indices.shape[1]
    hx = max(hs, hkv) if hs > 1 else hkv
    shared, bs = sel.indices.shape[2] == 1, sel.block_size
    slots = sel.indices.shape[3] * bs
    keys = slots
    if shared and p.normalize == "softmax" and slots:
        keys = min(slots, SPLIT_KEYS if sel.lengths is not None else bs * max(1, SPLIT_KEYS // bs))
    if shared:
        rows = BUDGET // max(1, batch * hq * keys)
    else:
        rows = BUDGET // max(1, batch * (hx * keys * (d + dv) + hq * keys))
    return Plan(hx, hq // hx, shared, max(1, min(lq, rows)), max(keys, 1), slots)


def _decoding(p: Problem) -> bool:
    """One selection for every query (a decoding step) on :mod:`.selected_decode` (its own file entered only then)."""
    return p.mask.selection.indices.shape[2] == 1 and selected_decode.applies(p)


def _pairs(p: Problem) -> bool:
    """Key blocks selected per query on :mod:`.selected_pairs` (its file entered only for key blocks)."""
    return p.mask.selection.block_size > 1 and selected_pairs.applies(p)


def _rows(p: Problem) -> bool:
    """Single keys selected per query on :mod:`.selected_rows` (its file entered only for single keys)."""
    return p.mask.selection.block_size == 1 and selected_rows.applies(p)


def density(p: Problem) -> float:
    """The fraction of the keys each query computes: ``n * block_size / Lk``, or for per-query key blocks the
    unions' width (:mod:`.selected_union`, read from the indices)."""
    lk = p.sizes[3]
    if _pairs(p):
        return selected_pairs.density(p)
    if _rows(p):
        return selected_rows.density(p)
    if selected_union.applies(p):
        return _union(p)[0].density
    return min(1.0, plan(p).slots / lk) if lk else 0.0


def _union(p: Problem):
    """The union plan of per-query key blocks, and the key/value head of each compute head."""
    pl = plan(p)
    idx_heads, kv_heads = _heads(p, pl)
    return selected_union.plan_for(p, pl.hx, pl.gp, idx_heads), kv_heads


def describe(p: Problem) -> str:
    if _decoding(p):
        return selected_decode.describe(p)
    if _pairs(p):
        return selected_pairs.describe(p)
    if _rows(p):
        return selected_rows.describe(p)
    pl = plan(p)
    split = f", split into chunks of {pl.keys} keys merged by log-sum-exp" if pl.keys < pl.slots else ""
    whose = "one selection per sequence" if pl.shared else "per query"
    return f"{pl.slots} selected keys per query gathered ({whose}, {pl.hx} head groups){split}"


def _heads(p: Problem, pl: Plan) -> tuple[torch.Tensor, torch.Tensor]:
    """For each compute head: its index head and its key/value head."""
    sel, dev = p.mask.selection, p.q.device
    first = torch.arange(pl.hx, device=dev) * pl.gp  # the first query head of each compute head
    return sel.index_head(first), first // p.groups


def _tokens(p: Problem, pl: Plan, idx: torch.Tensor, start: int, stop: int):
    """Key positions ``tok`` to gather for keys ``[start, stop)`` of the selection, whether each is real, and the
    positions masks read (logical positions for pages, else ``tok``)."""
    sel, lk, dev = p.mask.selection, p.sizes[3], idx.device
    bs = sel.block_size
    if sel.lengths is not None:  # pages: position t of the sequence lives on page table[t // bs], lane t % bs
        pos = torch.arange(start, stop, device=dev)
        page = idx.index_select(-1, pos // bs)
        tok = (page * bs + pos % bs).clamp(0, max(lk - 1, 0))
        valid = (page >= 0) & (pos < sel.lengths.to(dev).view(-1, 1, 1, 1))
        where = pos
    else:
        lane = torch.arange(bs, device=dev)
        block = idx[..., start // bs:stop // bs]
        tok = (block[..., None] * bs + lane).flatten(-2)
        valid = (block >= 0).repeat_interleave(bs, -1) & (tok < lk)
        tok = tok.clamp(0, max(lk - 1, 0))  # unreal slots read a real position (masked out, data zeroed)
        where = tok
    return tok, valid, where


def _gather(t, kv_heads: torch.Tensor, tok: torch.Tensor, valid: torch.Tensor, dtype, block_size: int = 1):
    """The keys (or values) of the slots ``tok``, ``(B, hx, c, n, E)``, zero where the slot is not real.

    ``t``: a tensor ``(B, H_kv, Lk, E)`` read by advanced indexing (pages), or the rows of
    :func:`_in_blocks` (whole blocks copied with ``index_select``; unreal slots read row 0, then zeroed)."""
    if isinstance(t, torch.Tensor):
        b = torch.arange(t.shape[0], device=t.device).view(-1, 1, 1, 1)
        out = t[b, kv_heads.view(1, -1, 1, 1), tok].to(dtype)
        return out.masked_fill(~valid[..., None], 0.0)
    rows, (batch, heads, blocks) = t
    slot = tok[..., ::block_size] // block_size  # (B, hx, c, n_slots): block ids
    b = torch.arange(batch, device=slot.device).view(-1, 1, 1, 1)
    flat = (b * heads + kv_heads.view(1, -1, 1, 1)) * blocks + slot
    real = valid[..., ::block_size] if block_size > 1 else valid
    shape = (*flat.shape, block_size, rows.shape[1] // block_size)
    if not rows.shape[0]:  # no keys at all
        return rows.new_zeros(shape).flatten(-3, -2).to(dtype)
    out = rows.index_select(0, torch.where(real, flat, 0).flatten()).view(shape)
    return out.masked_fill_(~real[..., None, None], 0.0).flatten(-3, -2).to(dtype)


def _in_blocks(p: Problem):
    """Keys and values as rows of whole blocks ``(B H_kv n_blocks, block_size E)`` for :func:`_gather`'s
    ``index_select`` (a view of a contiguous tensor whose length is a multiple of the block: a decoding step copies
    no cache); pages keep their tensors (their positions are gathered one by one)."""
    sel = p.mask.selection
    if sel.lengths is not None:
        return p.k, p.v, 1
    bs, lk = sel.block_size, p.sizes[3]
    out = []
    for t in (p.k, p.v):
        padded = torch.nn.functional.pad(t, (0, 0, 0, -lk % bs)) if lk % bs else t  # (pad copies even by 0)
        blocked = padded.unflatten(2, (-1, bs))  # (B, H_kv, nb, bs, E)
        rows = blocked.flatten(0, 2).flatten(1)
        out.append((rows, blocked.shape[:3]))
    return (*out, bs)


def _query_layout(p: Problem, pl: Plan, q: torch.Tensor, r0: int, r1: int):
    """The chunk's queries ``(B, hx, c', m, D)`` and the query head and position of each row (``c' m = gp c``)."""
    batch, _, _, d = q.shape
    c, dev = r1 - r0, q.device
    q5 = q.view(batch, pl.hx, pl.gp, q.shape[2], d)[:, :, :, r0:r1]
    heads = torch.arange(pl.hx, device=dev).view(1, -1, 1, 1, 1) * pl.gp
    if pl.shared:  # rows (g, i) of one product
        rows = torch.arange(pl.gp * c, device=dev).view(1, 1, 1, -1, 1)
        return q5.reshape(batch, pl.hx, 1, pl.gp * c, d), heads + rows // c, r0 + rows % c
    g = torch.arange(pl.gp, device=dev).view(1, 1, 1, -1, 1)
    return q5.permute(0, 1, 3, 2, 4), heads + g, torch.arange(r0, r1, device=dev).view(1, 1, -1, 1, 1)


def _split(p, inner, pl, r0, r1, start, stop, q, idx, heads, kv, shortest):
    """One split of the selection for the chunk's queries: ``(out (B, hx, c', m, Dv), lse or None)``."""
    sel = p.mask.selection
    keys, values, blocks = kv
    if sel.lengths is not None:  # pages: the chunk of every sequence, shared by its queries
        k_g, v_g, valid, where = page_split(p, start, stop, q.dtype, shortest)
        k_g, v_g = k_g.unsqueeze(2), v_g.unsqueeze(2)  # (B, H_kv, 1, n, E)
        if valid is None:  # every sequence holds every position of the chunk
            valid = torch.ones(1, 1, 1, stop - start, dtype=torch.bool, device=q.device)
    else:
        tok, valid, where = _tokens(p, pl, idx, start, stop)
        k_g = _gather(keys, heads, tok, valid, q.dtype, blocks)  # (B, hx, c', n, D)
        v_g = _gather(values, heads, tok, valid, q.dtype, blocks)  # (B, hx, c', n, Dv)
    q_c, h, q_idx = _query_layout(p, pl, q, r0, r1)
    b = torch.arange(q.shape[0], device=q.device).view(-1, 1, 1, 1, 1)
    kv_idx, kv_valid = where.unsqueeze(-2), valid.unsqueeze(-2)
    scores, allowed = block_scores(inner, q_c, k_g, b, h, q_idx, kv_idx, kv_valid)
    if sel.within is not None:  # pages: the caller's mask at the sequence's own positions and length
        lengths = sel.lengths.to(q.device).view(-1, 1, 1, 1, 1)
        allowed = allowed & sel.within.allows(b, h, q_idx, kv_idx, p.sizes[2], lengths)
    weights, lse = block_weights(inner, scores, allowed)
    return dropout(p, weights) @ v_g, lse


def merge(partials):
    """Partial ``(out, lse)`` of disjoint key sets merged in one step: ``lse = log sum_c exp lse_c``,
    ``out = sum_c exp(lse_c - lse) out_c`` (stacked, one weighted sum)."""
    if len(partials) == 1:
        return partials[0]
    return merge_stacked(torch.stack([out for out, _ in partials]), torch.stack([lse for _, lse in partials]))


def _to_heads(pl: Plan, out, lse, c: int):
    """``(B, hx, c', m, E)`` back to ``(B, Hq, c, E)`` (and the lse to ``(B, Hq, c)``)."""
    batch, e = out.shape[0], out.shape[-1]
    if pl.shared:
        out = out.reshape(batch, pl.hx * pl.gp, c, e)
        return out, None if lse is None else lse.reshape(batch, pl.hx * pl.gp, c)
    out = out.permute(0, 1, 3, 2, 4).reshape(batch, pl.hx * pl.gp, c, e)
    return out, None if lse is None else lse.permute(0, 1, 3, 2).reshape(batch, pl.hx * pl.gp, c)


def fused_ok(p: Problem, pl: Plan) -> bool:
    """torch's fused kernel computes a split exactly: softmax of dot products, no bias, dropout or autograd."""
    return (pl.shared and not p.needs_grad and rules.cpu_flash(p) and p.dropout_p == 0 and p.bias is None
            and p.modifier is None and p.normalize == "softmax" and p.score in ("dot", "scaled_dot")
            and p.mask.rest is None and (p.mask.selection.within is None or "h" not in p.mask.selection.within.uses))


def _fused_split(p, pl, r0, r1, start, stop, q, idx, heads, kv):
    """A split of a shared selection of key blocks on torch's fused kernel; None when its output cannot be
    trusted. (Pages: :func:`.page_chunks.fused_chunk`.) ``kv``: the keys and values as :func:`_in_blocks` gives them
    (selections that differ by head copy whole blocks with one ``index_select``)."""
    tok, valid, _ = _tokens(p, pl, idx, start, stop)  # (B | 1, 1 | hx, 1, n)
    every = bool(valid.all())
    if tok.shape[:2] == (1, 1) and heads.shape[0] == p.k.shape[1]:  # one selection, every key/value head in order

        def take(t):  # index_select: far cheaper than advanced indexing (a decoding step over a long cache)
            g = t.index_select(2, tok.view(-1)).to(q.dtype)
            g = g if every else g.masked_fill_(~valid.view(1, 1, -1, 1), 0.0)
            return g.expand(q.shape[0], -1, -1, -1)
        k_g, v_g = take(p.k), take(p.v)
    else:
        keys, values, blocks = kv
        k_g = _gather(keys, heads, tok, valid, q.dtype, blocks)[:, :, 0]  # (B, hx, n, D)
        v_g = _gather(values, heads, tok, valid, q.dtype, blocks)[:, :, 0]
    if every:  # no slot to hide: no mask
        out, lse = rules.FLASH(q[:, :, r0:r1], k_g, v_g, 0.0, False, scale=p.scale)[:2]
        has = None
    else:
        allowed = valid[:, :, 0, None, :]  # (B, 1 | hx, 1, n): per compute head when the selections differ by head
        if allowed.shape[1] > 1:  # each query head reads its compute head's row (k_g holds hx heads: GQA broadcast)
            allowed = allowed.repeat_interleave(pl.gp, 1)
        allowed = allowed.expand(q.shape[0], allowed.shape[1], r1 - r0, valid.shape[-1])  # (B, 1 | Hq, c, n)
        float_mask = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, _NEG_INF)
        out, lse = rules.FLASH(q[:, :, r0:r1], k_g, v_g, 0.0, False, attn_mask=float_mask, scale=p.scale)[:2]
        has = allowed.any(-1)  # (B, 1 | Hq, c)
    if has is None:
        if not bool(torch.isfinite(out.sum(-1) + lse).all()) or bool((lse == 0).any()):
            return None  # NaN, inf or a row torch zeroed (an lse of exactly 0): the exact split
        return out, lse
    if not bool(torch.isfinite(torch.where(has, out.sum(-1) + lse, 0.0)).all()) or bool((has & (lse == 0)).any()):
        return None  # NaN, inf or a row torch zeroed (an lse of exactly 0 on a row with keys): the exact split
    return out.masked_fill(~has[..., None], 0.0), lse.masked_fill(~has, _NEG_INF)


def _inner(p: Problem) -> Problem:
    """The problem each exact split computes: the rest of the mask, and its lse (which merges the splits)."""
    return p.with_inputs(mask=p.mask.rest, return_lse=p.normalize == "softmax")


def _chunk(p: Problem, inner: Problem | None, pl: Plan, extent: int, r0: int, r1: int, q: torch.Tensor, kv):
    """Queries ``[r0, r1)``: every split of the first ``extent`` keys computed and merged, ``(out (B, Hq, c, Dv),
    lse (B, Hq, c))``."""
    sel = p.mask.selection
    fused, lengths = fused_ok(p, pl), sel.lengths
    pages = lengths is not None and len(lengths) > 0
    held_keys = lengths.tolist() if pages else [extent]
    shortest, longest = min(held_keys), max(held_keys)
    batch, hq, c = q.shape[0], q.shape[1], r1 - r0
    if extent <= 0:  # a selection of no keys: every row empty
        return q.new_zeros(batch, hq, c, p.sizes[5]), q.new_full((batch, hq, c), _NEG_INF)
    held: list = []  # the selection's indices and heads, made when a split first needs them

    def selection():
        if not held:
            idx_heads, kv_heads = _heads(p, pl)
            idx = sel.indices.to(q.device)
            idx = idx.index_select(1, idx_heads) if idx.shape[1] > 1 else idx
            held.extend((idx if pl.shared else idx[:, :, r0:r1], kv_heads))
        return held

    def exact(start: int, stop: int):  # the split computed by formula, in the layout of the chunks around it
        idx, kv_heads = selection()
        split = _split(p, inner or _inner(p), pl, r0, r1, start, stop, q, idx, kv_heads, kv, shortest)
        out, lse = _to_heads(pl, *split, c)
        if not (fused and pages):
            return out, lse
        return out.reshape(batch, p.k.shape[1], -1, out.shape[-1]), lse.reshape(batch, p.k.shape[1], -1)

    if fused and pages:  # no autograd, pages: the heads of a group as rows (B, H_kv, g c, E), one merge
        merged = page_segments.run(p, q, r0, r1, pl.keys, held_keys) if page_segments.applies(p) else None
        out, lse = merged or merge_stacked(*fused_pages(p, r0, r1, extent, pl.keys, q, shortest, longest, exact))
        return out.reshape(batch, hq, c, out.shape[-1]), lse.reshape(batch, hq, c)
    partials = []
    for start in range(0, extent, pl.keys):
        stop = min(extent, start + pl.keys)
        piece = _fused_split(p, pl, r0, r1, start, stop, q, *selection(), kv) if fused else None
        partials.append(exact(start, stop) if piece is None else piece)
    return merge(partials)


def _by_row_chunks(chunk, n_rows: int, rows: int, *tensors):
    """``chunk(start, stop, *tensors)`` over the row chunks of :func:`.pipeline.row_chunks` (checkpointed where it
    says), joined along the rows."""
    return concat_pieces([checkpoint(chunk, r0, r1, *tensors, use_reentrant=False) if saved else chunk(r0, r1, *tensors)
                          for r0, r1, saved in row_chunks(n_rows, rows, *tensors)])


def run(p: Problem) -> KernelOutput:
    if p.sinks is not None:  # joined once with the merged splits (autograd carries the lse's gradient)
        bare = without_sinks(p)
        return join_sinks(p, bare, run(bare))
    if _decoding(p):
        step = selected_decode.run(p)
        if step is not None:
            return step
    if _pairs(p):
        return selected_pairs.run(p)
    if _rows(p):
        return selected_rows.run(p)
    pl = plan(p)
    lengths = p.mask.selection.lengths
    # made now, or (pages on torch's kernel, where a split runs by formula only if the kernel fails) when needed
    inner = None if lengths is not None and fused_ok(p, pl) else _inner(p)
    q = p.q.to(p.compute_dtype).contiguous()
    if selected_union.applies(p):
        union, kv_heads = _union(p)
        result = selected_union.run(p, inner or _inner(p), q, union, kv_heads)
        return result if p.return_lse else result._replace(lse=None)
    # Pages: the splits end at the longest sequence, not at the table's width, so a table padded with more
    # pages (or a contiguous cache with room to spare) cuts the same splits and gives the same bits.
    extent = pl.slots if lengths is None or not len(lengths) else min(pl.slots, int(lengths.max()))
    keys, values, blocks = _in_blocks(p)
    if isinstance(keys, torch.Tensor):
        def chunk(r0, r1, q, k, v):
            return _chunk(p, inner, pl, extent, r0, r1, q, (k, v, blocks))
        out, lse = _by_row_chunks(chunk, p.sizes[2], pl.rows, q, keys, values)
    else:  # rows of blocks: passed as tensors, so that a checkpointed chunk saves them as inputs
        (k_rows, shape), (v_rows, _) = keys, values

        def chunk(r0, r1, q, k, v):
            return _chunk(p, inner, pl, extent, r0, r1, q, ((k, shape), (v, shape), blocks))
        out, lse = _by_row_chunks(chunk, p.sizes[2], pl.rows, q, k_rows, v_rows)
    return KernelOutput(out, None, lse if p.return_lse else None)


def cost(p: Problem, grad: bool = False) -> PathCost:
    """Per chunk of queries and split of keys: the score and output products over the gathered keys (the fused
    kernel's formula where it runs); chunks are checkpointed under autograd when there are several."""
    if not grad and _decoding(p):
        return selected_decode.cost(p)
    if _pairs(p):
        return selected_pairs.cost(p, grad)
    if _rows(p):
        return selected_rows.cost(p, grad)
    if selected_union.applies(p):
        return selected_union.cost(p, _union(p)[0], grad)
    batch, hq, lq, _, d, dv = p.sizes
    pl = plan(p)
    products, fused = [], 0
    recompute = grad and pl.rows < lq
    for r0 in range(0, lq, pl.rows):
        c = min(lq, r0 + pl.rows) - r0
        cp, m = (1, pl.gp * c) if pl.shared else (c, pl.gp)
        for start in range(0, pl.slots, pl.keys):
            n = min(pl.slots, start + pl.keys) - start
            if fused_ok(p, pl):
                fused += batch * hq * c * n
                continue
            products += [Product("scores (q k^T, selected keys)", batch * pl.hx * cp, m, d, n, "scores", recompute),
                         Product("weights @ v (selected keys)", batch * pl.hx * cp, m, n, dv, "output", recompute)]
    gathered = min(batch * pl.hx * (1 if pl.shared else pl.rows) * pl.keys * (d + dv), BUDGET)
    workspace = (gathered + batch * hq * pl.rows * pl.keys) * itemsize(p)
    computed = batch * hq * lq * pl.slots
    return PathCost(computed, float(workspace), tuple(products),
                    fused=fused_attention("attention (selected keys, fused kernel per split)", fused, d, dv)
                    if fused else None, materialized=not fused)
