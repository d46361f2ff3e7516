"""Per-query key blocks, computed a block of queries at a time over the union of their selections.

Key-block selections (NSA, MoBA) change slowly along the queries: neighbours mostly choose the
same blocks. Gathering each query's ``k`` blocks copies ``Lq k bs D`` values and multiplies them
one query at a time; here the ``ROWS`` queries of a query block (and the query heads sharing an
index head) share one gathered copy of the union ``U_I`` of their selections, and their scores
are one matrix product ``(gp ROWS, D) @ (D, |U_I| bs)``. Each query still attends its own
blocks only (a membership table masks the others), so the function is the selection's; the
work is ``Lq |U| bs D`` with ``|U| >= k`` (the union's width, read from the indices). The plan
(unions, widths, chunks) is built once per mask and sizes and cached on the mask.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..functional.validate import Problem
from ..masks import cache
from .path_cost import PathCost, Product, itemsize
from .pipeline import KernelOutput, block_scores, block_weights, dropout

__all__ = ["UnionPlan", "applies", "plan_for", "run", "cost", "density", "ROWS", "BUDGET"]

ROWS = 64  # queries per query block
BUDGET = 1 << 24  # gathered keys, values and scores per chunk of query blocks


class UnionPlan(NamedTuple):
    """Compute heads, query blocks, and per chunk of query blocks ``(first, stop, unions (B, hx, c, W))``."""

    hx: int
    gp: int
    blocks_q: int
    chunks: list
    table: torch.Tensor  # (B, hx, Lq, n_blocks + 1): the blocks each query selected (last column: none)
    density: float


def applies(p: Problem) -> bool:
    """Selections of key blocks (not single keys, not pages) that differ per query."""
    sel = p.mask.selection
    return sel.block_size > 1 and sel.lengths is None and sel.indices.shape[2] > 1


def _build(p: Problem, hx: int, gp: int, heads: torch.Tensor) -> UnionPlan:
    sel, dev = p.mask.selection, p.q.device
    batch, _, lq, lk, d, dv = p.sizes
    bs, nk = sel.block_size, -(-lk // sel.block_size)
    idx = sel.indices.to(dev)
    idx = idx.index_select(1, heads) if idx.shape[1] > 1 else idx  # (B|1, hx|1, Lq, n)
    idx = torch.where((idx >= 0) & (idx < nk), idx, nk).expand(batch, hx, lq, idx.shape[-1])
    table = torch.zeros(batch, hx, lq, nk + 1, dtype=torch.bool, device=dev).scatter_(3, idx, True)
    nq = -(-lq // ROWS)
    grouped = torch.nn.functional.pad(table, (0, 0, 0, nq * ROWS - lq)).view(batch, hx, nq, ROWS, nk + 1)
    union = grouped.any(3)[..., :nk]  # (B, hx, nq, nk)
    widths = union.sum(-1).amax((0, 1)).tolist()  # per query block, the widest union over batch and heads
    order = torch.argsort((~union).to(torch.int8) * 2, dim=-1, stable=True)  # selected blocks first, ascending
    ids = torch.where(torch.gather(union, -1, order), order, nk)
    chunks, first = [], 0
    while first < nq:
        stop, width = first, 0
        while stop < nq and (stop == first or batch * hx * (stop + 1 - first) * max(width, widths[stop]) * bs * (
                d + dv + gp * ROWS) <= BUDGET):
            width = max(width, widths[stop])
            stop += 1
        chunks.append((first, stop, ids[:, :, first:stop, :max(width, 1)]))
        first = stop
    density = float(union.sum()) * bs / max(1, batch * hx * nq * lk)
    return UnionPlan(hx, gp, nq, chunks, table, min(1.0, density))


def plan_for(p: Problem, hx: int, gp: int, heads: torch.Tensor) -> UnionPlan:
    """The plan of ``p`` (cached on its mask for these sizes and device)."""
    batch, hq, lq, lk, d, dv = p.sizes
    key = (batch, hq, lq, lk, d, dv, hx, str(p.q.device), ROWS, BUDGET)
    return cache.on(p.mask, "union_plans", max_entries=4).get_or_build(key, lambda: _build(p, hx, gp, heads))


def density(pl: UnionPlan) -> float:
    return pl.density


def _rows_of(t: torch.Tensor, bs: int, lk: int) -> torch.Tensor:
    """``(B, H, Lk, E)`` as rows of whole blocks ``(B H n_blocks + 1, bs E)``, the last row zeros."""
    blocked = torch.nn.functional.pad(t, (0, 0, 0, -lk % bs)).unflatten(2, (-1, bs))
    return torch.cat([blocked.flatten(0, 2).flatten(1), t.new_zeros(1, bs * t.shape[-1])])


def _chunk(p: Problem, inner: Problem, pl: UnionPlan, chunk, q, k_rows, v_rows, kv_heads):
    """One chunk of query blocks: ``(out (B, Hq, c ROWS, Dv), lse)``."""
    first, stop, ids = chunk
    sel, dev = p.mask.selection, q.device
    batch, hq, lq, lk, d, dv = p.sizes
    bs, nk, c, w = sel.block_size, -(-lk // sel.block_size), stop - first, ids.shape[-1]
    b = torch.arange(batch, device=dev).view(-1, 1, 1, 1)
    flat = torch.where(ids < nk, (b * p.k.shape[1] + kv_heads.view(1, -1, 1, 1)) * nk + ids, k_rows.shape[0] - 1)
    k_g = k_rows.index_select(0, flat.flatten()).view(batch, pl.hx, c, w * bs, d)
    v_g = v_rows.index_select(0, flat.flatten()).view(batch, pl.hx, c, w * bs, dv)
    q_blk = q[:, :, :, first * ROWS:stop * ROWS].unflatten(3, (c, ROWS)).transpose(2, 3).flatten(3, 4)
    rows = torch.arange(pl.gp * ROWS, device=dev)
    q_idx = (first * ROWS + torch.arange(c, device=dev).view(1, 1, -1, 1, 1) * ROWS + rows.view(1, 1, 1, -1, 1)
             % ROWS)  # (1, 1, c, gp ROWS, 1)
    h = torch.arange(pl.hx, device=dev).view(1, -1, 1, 1, 1) * pl.gp + rows.view(1, 1, 1, -1, 1) // ROWS
    kv_idx = (ids[..., None] * bs + torch.arange(bs, device=dev)).flatten(-2).unsqueeze(-2)  # (B, hx, c, 1, w bs)
    x = torch.arange(pl.hx, device=dev).view(1, -1, 1, 1, 1)
    member = pl.table[b.unsqueeze(-1), x, q_idx.clamp(max=lq - 1), ids.unsqueeze(-2)]  # (B, hx, c, gp ROWS, w)
    real = member.repeat_interleave(bs, -1) & (kv_idx < lk) & (q_idx < lq)
    scores, allowed = block_scores(inner, q_blk, k_g, b.unsqueeze(-1), h, q_idx.clamp(max=lq - 1),
                                   kv_idx.clamp(max=lk - 1), real)
    weights, lse = block_weights(inner, scores, allowed)
    out = (dropout(p, weights) @ v_g).unflatten(3, (pl.gp, ROWS)).permute(0, 1, 3, 2, 4, 5)  # (B, hx, gp, c, R, Dv)
    lse = lse.unflatten(3, (pl.gp, ROWS)).permute(0, 1, 3, 2, 4) if lse is not None else None
    return out.reshape(batch, hq, c * ROWS, dv), None if lse is None else lse.reshape(batch, hq, c * ROWS)


def run(p: Problem, inner: Problem, q: torch.Tensor, pl: UnionPlan, kv_heads: torch.Tensor) -> KernelOutput:
    """``q`` ``(B, Hq, Lq, D)`` in the compute dtype; every chunk, checkpointed under autograd when several."""
    from torch.utils.checkpoint import checkpoint

    batch, _, lq, lk, d, _ = p.sizes
    bs = p.mask.selection.block_size
    q = torch.nn.functional.pad(q, (0, 0, 0, pl.blocks_q * ROWS - lq)).view(batch, pl.hx, pl.gp, -1, d)
    k_rows, v_rows = (_rows_of(t.to(p.compute_dtype), bs, lk) for t in (p.k, p.v))
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k_rows, v_rows))
    pieces = []
    for chunk in pl.chunks:
        args = (p, inner, pl, chunk, q, k_rows, v_rows, kv_heads)
        pieces.append(checkpoint(_chunk, *args, use_reentrant=False) if grad and len(pl.chunks) > 1
                      else _chunk(*args))
    out = torch.cat([o for o, _ in pieces], 2)[:, :, :lq]
    lse = torch.cat([s for _, s in pieces], 2)[:, :, :lq] if pieces[0][1] is not None else None
    return KernelOutput(out, None, lse)


def cost(p: Problem, pl: UnionPlan, grad: bool) -> PathCost:
    """The two products of each chunk over its union's width (padding slots included)."""
    batch, _, _, _, d, dv = p.sizes
    bs = p.mask.selection.block_size
    recompute = grad and len(pl.chunks) > 1
    products, computed = [], 0
    for first, stop, ids in pl.chunks:
        c, w = stop - first, ids.shape[-1]
        m, n = pl.gp * ROWS, w * bs
        products += [Product("scores (q k^T, union of selected blocks)", batch * pl.hx * c, m, d, n, "scores",
                             recompute),
                     Product("weights @ v (union of selected blocks)", batch * pl.hx * c, m, n, dv, "output",
                             recompute)]
        computed += batch * pl.hx * c * m * n
    return PathCost(computed, float(min(computed, BUDGET) * itemsize(p) * 3), tuple(products))
