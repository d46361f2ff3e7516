"""The block-sparse kernel: computes only the (query block, key block) pairs a mask allows.

The mask's :class:`~attnkit.masks.BlockLayout` says which key blocks each query
block may touch. For query block ``I`` the active key blocks ``J_1..J_w`` are
gathered into one ``(w * bs)``-long key row, so attention is a batched matmul
over ``(nq, bs) x (w * bs)`` scores: ``O(L * w * bs * D)`` work and memory,
never ``O(Lq Lk)``. Inside the gathered row the exact mask is evaluated at the
gathered indices, so partial blocks are exact; padding lanes and unused slots are
masked out. With no mask the layout is full: plain dense attention.
Rows are normalised whole, so softmax, sparsemax, sigmoid and hard
all work; autograd provides the backward (the gather's backward scatter-adds
into the key blocks, deterministically on CPU). Large problems run in
checkpointed slabs of query blocks to bound memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..functional.masks import full
from ..functional.validate import Problem
from .common import (
    KernelOutput,
    block_scores,
    block_weights,
    concat_pieces,
    dropout,
    run_row_chunks,
    upcast_inputs,
)

NAME = "blocksparse"
BLOCK_SIZES = (64, 128)
BUDGET = 1 << 25  # gathered score elements alive at once


def refusal(p: Problem) -> str | None:
    if torch.compiler.is_compiling():
        return "under torch.compile: block layouts are data-dependent"
    if p.return_weights:
        return "never builds the dense (Lq, Lk) weights that return_weights asks for"
    if callable(p.normalize):
        return "custom normalizers would see gathered rows; use the reference or chunked kernel"
    return None


def union_layout(p: Problem, bs: int) -> torch.Tensor:
    """Active blocks ``(nq, nk)`` for any batch element or head (layouts are cached on the mask)."""
    batch, heads, lq, lk, _, _ = p.sizes
    mask = p.mask if p.mask is not None else full()
    layout = mask.block_layout(lq, lk, bs, device=p.q.device, batch=batch, heads=heads)
    return layout.active.any(0).any(0)


def choose_block_size(p: Problem) -> int:
    """The block size with the fewest computed score entries (layouts are cached on the mask)."""
    def cost(bs):
        groups = width_groups(union_layout(p, bs))
        computed = sum(len(rows) * max(width, 1) for rows, width in groups) * bs * bs
        return computed * (1 + 16 / bs)  # per-block overhead favours larger blocks
    return min(BLOCK_SIZES, key=cost)


def width_groups(active: torch.Tensor) -> list[tuple[torch.Tensor, int]]:
    """Query blocks grouped by how many key blocks they touch: ``[(block ids, width)]``.

    Every block of a group is computed at the group's width, so a few wide rows
    (global tokens) get a group of their own instead of widening every row.
    A new group starts where the width falls below half the group's widest.
    """
    counts = active.sum(1)
    order = torch.argsort(counts, descending=True, stable=True)
    widths = counts[order].tolist()
    groups, first = [], 0
    for i in range(1, len(widths) + 1):
        if i == len(widths) or widths[i] * 2 < widths[first]:
            groups.append((order[first:i].sort().values, widths[first]))  # ascending: one group = identity
            first = i
    return groups


def gather_plan(active: torch.Tensor, width: int):
    """For rows of a layout, the active key blocks ``idx (n, w)`` and which slots are real ``valid (n, w)``."""
    nk = active.shape[1]
    key = (~active).to(torch.int64) * nk + torch.arange(nk, device=active.device)  # active blocks first, in order
    idx = torch.argsort(key, dim=1)[:, :max(width, 1)]
    return idx, torch.gather(active, 1, idx)


def _pad_to(t: torch.Tensor, length: int) -> torch.Tensor:
    return F.pad(t, (0, 0, 0, length - t.shape[2])) if t.shape[2] != length else t


def _slab(p: Problem, rows, qb, kb, vb, idx, valid, bs: int):
    """Query blocks ``rows`` (ids): gathered scores ``(B, H, n, bs, w*bs)`` and outputs."""
    batch, heads, lq, lk, _, _ = p.sizes
    n, w = idx.shape
    k_g = kb.index_select(2, idx.flatten()).view(*kb.shape[:2], n, w * bs, kb.shape[-1])  # (B, H, n, w*bs, D)
    v_g = vb.index_select(2, idx.flatten()).view(*vb.shape[:2], n, w * bs, vb.shape[-1])  # (B, H, n, w*bs, Dv)
    lane = torch.arange(bs, device=idx.device)
    kv_idx = (idx[:, :, None] * bs + lane).view(1, 1, n, 1, w * bs)
    q_idx = (rows[:, None] * bs + lane).view(1, 1, n, bs, 1)
    kv_valid = valid[:, :, None].expand(n, w, bs).reshape(1, 1, n, 1, w * bs) & (kv_idx < lk)
    b = torch.arange(batch, device=idx.device).view(-1, 1, 1, 1, 1)
    h = torch.arange(heads, device=idx.device).view(1, -1, 1, 1, 1)
    # Padding lanes (past Lq or Lk) read the last real index: kv_valid masks them, padded rows are dropped.
    q_rows = qb[:, :, int(rows[0]):int(rows[0]) + n] if _is_range(rows) else qb.index_select(2, rows)
    scores, allowed = block_scores(p, q_rows, k_g, b, h, q_idx.clamp(max=max(lq - 1, 0)),
                                   kv_idx.clamp(max=max(lk - 1, 0)), kv_valid)
    weights, lse = block_weights(p, scores, allowed)
    out = dropout(p, weights) @ v_g  # (B, H, n, bs, Dv)
    return out, lse


def _is_range(rows: torch.Tensor) -> bool:
    """True when block ids are consecutive, so a slice (a view) can stand for a gather (a copy)."""
    return rows.numel() > 0 and int(rows[-1]) - int(rows[0]) == rows.numel() - 1


def _run_group(p: Problem, rows, width, active, qb, kb, vb, bs):
    idx, valid = gather_plan(active[rows], width)
    blocks_per_slab = max(1, BUDGET // max(1, p.sizes[0] * p.sizes[1] * bs * idx.shape[1] * bs))
    return run_row_chunks(lambda s, e, q_, k_, v_: _slab(p, rows[s:e], q_, k_, v_, idx[s:e], valid[s:e], bs),
                          len(rows), blocks_per_slab, qb, kb, vb)


def run(p: Problem) -> KernelOutput:
    q, k, v = upcast_inputs(p)
    batch, heads, lq, _, d, dv = p.sizes
    bs = choose_block_size(p)
    active = union_layout(p, bs)
    nq, nk = active.shape
    qb = _pad_to(q, nq * bs).view(batch, heads, nq, bs, d)
    kb = _pad_to(k, nk * bs).view(batch, heads, nk, bs, d)
    vb = _pad_to(v, nk * bs).view(batch, heads, nk, bs, dv)
    groups = width_groups(active)
    out, lse = concat_pieces([_run_group(p, rows, width, active, qb, kb, vb, bs) for rows, width in groups])
    if len(groups) > 1:  # back to query-block order
        inverse = torch.argsort(torch.cat([rows for rows, _ in groups]))
        out, lse = out.index_select(2, inverse), lse.index_select(2, inverse) if lse is not None else None
    out = out.reshape(batch, heads, nq * bs, dv)[:, :, :lq]
    lse = lse.reshape(batch, heads, nq * bs)[:, :, :lq] if lse is not None else None
    return KernelOutput(out, None, lse)
