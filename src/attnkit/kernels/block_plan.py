"""Block plans: which (query block, key block) pairs the block-sparse paths compute, in which slabs.

The mask's :class:`~attnkit.masks.BlockLayout` says which key blocks each query
block may touch. For query block ``I`` the active key blocks ``J_1..J_w`` are
gathered into one ``(w * bs)``-long key row, so attention is a batched matmul
over ``(nq, bs) x (w * bs)`` scores: ``O(L * w * bs * D)`` work and memory,
never ``O(Lq Lk)``. Partial blocks are exact (the mask is evaluated there);
padding lanes and unused slots are masked out. With no mask the layout is full.

Query blocks are sorted by how many key blocks they touch and cut into slabs of
about ``SLAB`` scores, each computed at its widest row's width, so a few wide
rows (global tokens) never widen the others. The three gathered paths
(:mod:`.blocksparse_fused`, :mod:`.blocksparse_masked`, :mod:`.blocksparse_gathered`)
share the plan, which is computed once per mask and sizes and kept in a bounded
cache on the mask (:func:`plan_for`), so the dispatcher's density and the path's
slabs come from one computation.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..functional.validate import Problem
from ..masks import cache
from ..masks import full as full_mask
from . import rules
from .path_cost import PathCost, fused_attention, itemsize
from .pipeline import KernelOutput

__all__ = ["BlockPlan", "plan_for", "plan_key", "density", "softmax_cost", "layouts", "width_groups",
           "gather_plan", "to_blocks", "from_blocks", "allowed_in", "query_blocks", "put_query_blocks", "BLOCK_SIZES",
           "SLAB"]

BLOCK_SIZES = (64, 128)
SLAB = 1 << 21  # gathered score elements per slab: few large ops; temporaries small enough to reuse
# A slab's rows are at least this share of its widest, (numerator, denominator). (1, 1): one width per
# slab, no padding slots. Measured at L = 4096, 1 thread, "causal() & fixed(512, 32)" (546 computed blocks
# at 3/4, 512 at 1/1, 15 slabs instead of 12): 0.173 -> 0.166 of SDPA's time with the dense mask forward,
# 0.193 -> 0.144 forward+backward (medians of 9 and 5 interleaved rounds on a loaded machine).
WIDTH_SHARE = (1, 1)
PLAN_CACHE_ENTRIES = 8  # plans kept per mask (lengths x sizes), most recent first
_FULL = full_mask()  # the layout of "no mask"; plans for it are cached here


class BlockPlan(NamedTuple):
    """The block size, the slabs ``[(rows, idx (n, w), valid (n, w), full_slot (n, w))]`` and the density.

    ``density`` is the fraction of (query block, key block) pairs some batch element
    or head may attend, at the chosen block size (what the dispatcher compares).
    """

    bs: int
    slabs: list
    density: float

    @property
    def computed_blocks(self) -> int:
        """(query block, key block) pairs the slabs compute, padding slots included."""
        return sum(idx.numel() for _, idx, _, _ in self.slabs)


def layouts(p: Problem, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(active, full)`` ``(nq, nk)`` for all batch elements and heads at once (layouts are cached on the mask).

    ``active``: some element or head may attend somewhere in the block; ``full``: every
    in-range entry is allowed for every element and head. A last key block that runs
    past ``Lk`` is never full, so its padding lanes are masked.
    """
    batch, heads, lq, lk, _, _ = p.sizes
    mask = p.mask if p.mask is not None else _FULL
    layout = mask.block_layout(lq, lk, bs, device=p.q.device, batch=batch, heads=heads)
    active, full = layout.active.any(0).any(0), layout.full.all(0).all(0) & layout.active.any(0).any(0)
    if lk % bs:
        full = full.clone()
        full[:, -1] = False
    return active, full


def width_groups(active: torch.Tensor, rows_cost: int = 1) -> list[tuple[torch.Tensor, int]]:
    """The slabs of query blocks and their widths ``[(block ids, width)]``.

    Blocks are sorted by how many key blocks they touch, and every block of a slab is
    computed at the slab's width (its widest), so a few wide rows (global tokens) never
    widen the others: a slab ends where the width falls below ``WIDTH_SHARE`` of its widest, or at
    ``SLAB`` scores (``rows_cost`` = score elements per block and key block, ``B*H*bs*bs``).
    Blocks that touch no key block are in no slab (their output is 0).
    """
    counts = active.sum(1)
    order = torch.argsort(counts, descending=True, stable=True)
    widths = counts[order].tolist()
    groups, first = [], 0
    while first < len(widths) and widths[first] > 0:
        stop, limit = first + 1, first + max(1, SLAB // (rows_cost * widths[first]))
        share, whole = WIDTH_SHARE
        while stop < min(len(widths), limit) and widths[stop] * whole >= widths[first] * share:
            stop += 1
        groups.append((order[first:stop].sort().values, widths[first]))  # ascending: consecutive ids slice
        first = stop
    return groups


def gather_plan(active: torch.Tensor, width: int):
    """For rows of a layout, the active key blocks ``idx (n, w)`` and which slots are real ``valid (n, w)``."""
    nk = active.shape[1]
    key = (~active).to(torch.int64) * nk + torch.arange(nk, device=active.device)  # active blocks first, in order
    idx = torch.argsort(key, dim=1)[:, :width]
    return idx, torch.gather(active, 1, idx)


def _choose_block_size(p: Problem) -> int:
    """The block size with the fewest computed score entries, or the one the mask is laid out for (documents
    aligned to blocks: :mod:`attnkit.masks.documents`)."""
    laid_out = getattr(p.mask, "plan_block_size", None)
    if laid_out is not None:
        return laid_out

    def cost(bs):
        computed = sum(len(rows) * width for rows, width in width_groups(layouts(p, bs)[0])) * bs * bs
        return computed * (1 + 16 / bs)  # per-block overhead favours larger blocks
    return min(BLOCK_SIZES, key=cost)


def _build(p: Problem) -> BlockPlan:
    bs = _choose_block_size(p)
    active, full = layouts(p, bs)
    slabs = []
    for rows, width in width_groups(active, p.sizes[0] * p.sizes[1] * bs * bs):
        idx, valid = gather_plan(active[rows], width)
        slabs.append((rows, idx, valid, torch.gather(full[rows], 1, idx) & valid))
    return BlockPlan(bs, slabs, active.float().mean().item() if active.numel() else 0.0)


def plan_key(p: Problem) -> tuple:
    """What a plan depends on besides the mask: sizes, device, and the block sizes and slab (tests change them)."""
    batch, heads, lq, lk, _, _ = p.sizes
    return lq, lk, batch, heads, str(p.q.device), BLOCK_SIZES, SLAB, WIDTH_SHARE


def plan_for(p: Problem) -> BlockPlan:
    """The plan of ``p``: built once per mask, sizes and device, then read from the mask's bounded cache."""
    mask = p.mask if p.mask is not None else _FULL
    return cache.on(mask, "block_plans", max_entries=PLAN_CACHE_ENTRIES).get_or_build(plan_key(p), lambda: _build(p))


@rules.reads_data
def density(p: Problem) -> float:
    """The plan's block density: the fraction of (query block, key block) pairs some element or head attends.

    It reads the mask's layout, so a decision that reads no data leaves it to run time."""
    return plan_for(p).density


def allowed_in(p: Problem, q_blocks, kv_blocks, bs: int):
    """The mask at query blocks ``q_blocks (P,)`` x key lanes ``kv_blocks (P, c)``: bool ``(B|1, H|1, P, bs, c*bs)``."""
    batch, heads, lq, lk, _, _ = p.sizes
    dev = kv_blocks.device
    lane = torch.arange(bs, device=dev)
    kv = (kv_blocks[:, :, None] * bs + lane).flatten(1)  # (P, c*bs)
    allowed = (kv < lk)[None, None, :, None, :]  # padding lanes past Lk
    if p.mask is not None:
        q_idx = (q_blocks[:, None] * bs + lane).clamp(max=max(lq - 1, 0))[None, None, :, :, None]  # (1,1,P,bs,1)
        b = torch.arange(batch, device=dev).view(-1, 1, 1, 1, 1)
        h = torch.arange(heads, device=dev).view(1, -1, 1, 1, 1)
        allowed = allowed & p.mask.allows(b, h, q_idx, kv.clamp(max=max(lk - 1, 0))[None, None, :, None, :], lq, lk)
    return allowed


def query_blocks(t, rows):
    """Query blocks ``rows`` of ``(B, H, nq, bs, E)``: a slice when consecutive, else a gather."""
    first = int(rows[0])
    return t[:, :, first:first + len(rows)] if int(rows[-1]) - first == len(rows) - 1 else t.index_select(2, rows)


def put_query_blocks(dst, rows, value) -> None:
    """``value`` written into the query blocks ``rows`` of ``dst`` ``(B, H, nq, bs, E)`` (a slice when consecutive)."""
    first = int(rows[0])
    if int(rows[-1]) - first == len(rows) - 1:
        dst[:, :, first:first + len(rows)] = value
    else:
        dst.index_copy_(2, rows, value)


def _pad_to(t: torch.Tensor, length: int) -> torch.Tensor:
    return F.pad(t, (0, 0, 0, length - t.shape[2])) if t.shape[2] != length else t


def to_blocks(q, k, v, bs: int):
    """``(B, H, L, E)`` tensors as ``(B, H, n_blocks, bs, E)``, the last block zero-padded."""
    out = []
    for t in (q, k, v):
        n = -(-t.shape[2] // bs)
        out.append(_pad_to(t, n * bs).view(*t.shape[:2], n, bs, t.shape[-1]))
    return tuple(out)


def from_blocks(p: Problem, out, lse) -> KernelOutput:
    """Block outputs ``(B, H, nq, bs, Dv)`` and lse ``(B, H, nq, bs)`` back to ``(B, H, Lq, .)``."""
    batch, heads, lq, _, _, dv = p.sizes
    nq, bs = out.shape[2:4]
    out = out.reshape(batch, heads, nq * bs, dv)[:, :, :lq]
    lse = lse.reshape(batch, heads, nq * bs)[:, :, :lq] if lse is not None else None
    return KernelOutput(out, None, lse)


def softmax_cost(p: Problem, label: str) -> PathCost:
    """Plain softmax over the plan's gathered key blocks, with a hand-written or fused backward that recomputes
    the scores; each slab's scores exist in memory (the masked path) or in the fused kernel's tiles."""
    batch, heads, _, lk, d, dv = p.sizes
    pl = plan_for(p)
    computed = pl.computed_blocks * batch * heads * pl.bs * pl.bs
    workspace = 3.0 * min(computed, SLAB) * itemsize(p) + 2.0 * batch * heads * lk * (d + dv) * itemsize(p)
    return PathCost(computed, workspace, fused=fused_attention(label, computed, d, dv))
