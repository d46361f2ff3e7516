"""Causal attention over per-query key blocks (NSA, MoBA), tiled by key block: work ``O(Lq k bs D)``.

Query ``t`` of head ``h`` attends the key blocks ``S_t`` it selected (block ``c``: keys
``c bs .. c bs + bs - 1``), causally::

    out_t = softmax_{j in K_t}(q_t k_j^T * scale) V[K_t],   K_t = {j in blocks S_t : j <= t}

A selected block ``c`` is either the query's own block (``c = t // bs``, causal inside) or
a block wholly in its past (``c < t // bs``: every key visible); later blocks see nothing.
The work is cut accordingly, with no ``Lq x Lk`` tensor and no per-query copy of the keys:

- own blocks: one call of torch's fused kernel, causal, on the queries and keys viewed as
  ``(B, H n_blocks, bs, D)`` in place;
- past blocks: the (query, block) pairs are grouped by key block and the ``c`` queries of a
  group cut into ``ceil(c / ROWS)`` tiles of equal height (rounded up to a multiple of
  ``STEP``); each tile is one batch entry of the fused kernel (its queries against the
  block's ``bs`` keys, no mask), the tiles of one height a budget at a time, so the copies
  held at once are bounded whatever ``L``. Tall tiles let the kernel take large query
  splits (at most ``STEP - 1`` empty rows a tile on average).

The partial outputs merge by log-sum-exp (Milakov and Gimelshein 2018, the online
softmax)::

    lse_t = log sum_p exp(lse_p),    out_t = sum_p exp(lse_p - lse_t) out_p

summed against a reference ``m_t`` per row (``exp(lse_p - m_t) out_p``, then divided by the sum of the weights)
that rises only when a tile's lse passes it by ``_SLACK`` (the weights stay below ``exp(30)``), so the rows
already summed are rescaled a few times per row, not once per batch of tiles.

The backward recomputes per tile (a custom ``autograd.Function``, nothing kept but the
inputs, the output and the lse): for keys split in disjoint sets the gradient of each set is
the flash-attention backward of that set with the *final* output and lse (Dao et al. 2022,
arXiv:2205.14135, Alg. 4: ``P = exp(S - lse)``, ``dS = P (dP - rowsum(dO o O))``), so torch's
fused backward runs per tile and its ``dq`` / ``dk`` / ``dv`` are added where they belong.

Shapes: ``q`` ``(B, H, L, D)``, ``k`` / ``v`` ``(B, H_kv, L, D)``, ``indices``
``(B|1, Hs|1, L, n)`` distinct block ids (``-1``: unused), index head ``s`` serving query heads
``[s g, (s + 1) g)``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..functional.validate import Problem
from ..masks import cache
from ..masks.selected import selection_of
from .path_cost import PathCost, fused_attention, itemsize
from .pipeline import KernelOutput
from .rules import FLASH, FLASH_BACKWARD, plain_causal

__all__ = ["Tiles", "tiles", "plain_causal", "applies", "run", "density", "cost", "describe", "attend", "ROWS",
           "BUDGET"]

ROWS = 1024  # queries per tile at most: torch's kernel runs larger query splits on taller tiles (1 thread: 0.75x the
# time per score of 128-row tiles)
STEP = 32  # tile heights are multiples of this (or ROWS): tiles of one height share a call of torch's kernel
BUDGET = 1 << 22  # elements of gathered queries, keys and values per batch of tiles
_NEG_INF = float("-inf")
_SLACK = 30.0  # a row's running reference rises only when a tile's lse passes it by this: weights <= exp(30)


class Tiles(NamedTuple):
    """The past-block pairs cut into tiles, by height: tile ``t`` of height ``h`` holds ``h`` query rows (flat over
    ``(B, H, Lp)``, ``-1``: an empty row) and a key block (flat over ``(B, H_kv, n_blocks)``); ``own`` ``(B H Lp,)``
    whether each query selected its own block."""

    rows: list  # per height: (T_h, h) int64 into the flat queries, -1 where the tile has no query
    blocks: list  # per height: (T_h,) int64 into the flat key blocks
    own: torch.Tensor  # (B H Lp,) bool
    pairs: int  # (query, past block) pairs


def tiles(indices: torch.Tensor, batch: int, heads: int, kv_heads: int, length: int, bs: int) -> Tiles:
    """The tiles of a selection, batched over batch, heads and queries (sorting, no loop over blocks).

    The ``c`` queries of a (head, key block) pair group are cut into ``ceil(c / ROWS)`` tiles of equal height, rounded
    up to a multiple of ``STEP`` (at most ``ROWS``): at most ``STEP - 1`` empty rows a tile."""
    dev = indices.device
    nb = -(-length // bs)
    lp = nb * bs
    g_idx = heads // indices.shape[1] if indices.shape[1] > 1 else heads
    idx = indices.repeat_interleave(g_idx, 1) if indices.shape[1] > 1 else indices
    idx = idx.expand(batch, heads, length, idx.shape[-1])
    t = torch.arange(length, device=dev).view(1, 1, -1, 1)
    own_block = t // bs
    own = (idx == own_block).any(-1)  # (B, H, L)
    own = torch.nn.functional.pad(own, (0, lp - length)).flatten()
    past = ((idx >= 0) & (idx < own_block)).flatten().nonzero().squeeze(1)  # flat (b, h, q, s), in that order
    n_sel, pairs = idx.shape[-1], past.numel()
    group = idx.flatten()[past]  # the pair's key block
    past = past.div_(n_sel, rounding_mode="floor")  # flat (b, h, q); in place, as below: few pair-long temporaries
    bh = past // length
    query = past.add_(bh * (lp - length))  # flat over (B, H, Lp)
    group = group.add_(bh.mul_(nb))  # (B, H, n_blocks) flat: the tile's query head and key block
    del bh, past
    group, order = torch.sort(group, stable=True)
    query = query[order]
    del order
    counts = torch.bincount(group, minlength=batch * heads * nb)
    per_group = -(-counts // ROWS)
    per_tile = -(-counts // per_group.clamp(min=1))  # queries per tile, the group's split even
    height = torch.clamp(-(-per_tile // STEP) * STEP, max=ROWS)
    first_tile = torch.cumsum(per_group, 0) - per_group
    first_pair = torch.cumsum(counts, 0) - counts
    pos = torch.arange(pairs, device=dev).sub_(first_pair[group])  # the pair's place in its group
    pair_height = height[group]
    tile = first_tile[group].add_(pos // pair_height)
    del group
    tile_group = torch.repeat_interleave(torch.arange(batch * heads * nb, device=dev), per_group)
    bh, blk = tile_group // nb, tile_group % nb
    kv_row = ((bh // heads) * kv_heads + (bh % heads) // (heads // kv_heads)) * nb + blk
    tile_height = height[tile_group]  # (T,)
    by_height = torch.argsort(tile_height, stable=True)  # tiles of one height together, in their order
    sorted_height = tile_height[by_height]
    heights, tiles_per = torch.unique_consecutive(sorted_height, return_counts=True)
    offset = torch.empty_like(by_height)  # a tile's first row in one table of every height's tiles, by height
    offset[by_height] = torch.cumsum(sorted_height, 0) - sorted_height
    table = torch.full((int(tile_height.sum()),), -1, dtype=torch.long, device=dev)
    table[offset[tile].add_(pos.remainder_(pair_height))] = query
    del tile, pos, pair_height, query
    rows, blocks, tile0, row0 = [], [], 0, 0
    for hgt, count in zip(heights.tolist(), tiles_per.tolist(), strict=True):
        rows.append(table[row0:row0 + count * hgt].view(count, hgt))
        blocks.append(kv_row[by_height[tile0:tile0 + count]])
        tile0, row0 = tile0 + count, row0 + count * hgt
    return Tiles(rows, blocks, own, pairs)


def _take(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` ``(T, ...)`` of ``t`` ``(N, ...)``, one tile per batch entry: ``(T, 1, ..., ...)``."""
    return t.index_select(0, index.flatten()).view(*index.shape, *t.shape[1:]).unsqueeze(1)


def _padded(t: torch.Tensor, lp: int) -> torch.Tensor:
    """``(B, H, L, E)`` contiguous with ``Lp - L`` zero rows after (no copy when already so)."""
    return torch.nn.functional.pad(t, (0, 0, 0, lp - t.shape[2])).contiguous() if lp > t.shape[2] else t.contiguous()


def _own_blocks(t: torch.Tensor, heads: int, bs: int) -> torch.Tensor:
    """``(B, H_t, Lp, D)`` -> ``(B, H Lp / bs, bs, D)``, key/value heads repeated for their query heads."""
    if t.shape[1] != heads:
        t = t.repeat_interleave(heads // t.shape[1], 1)
    return t.reshape(t.shape[0], -1, bs, t.shape[-1])


def _batches(tl: Tiles, bs: int, d: int):
    """Batches of tiles of one height within ``BUDGET``: ``(rows clamped to a real row, empty rows, key blocks)``."""
    for rows_h, blocks_h in zip(tl.rows, tl.blocks, strict=True):
        step = max(1, BUDGET // max(1, rows_h.shape[1] * d * 3 + 2 * bs * d))
        for start in range(0, len(blocks_h), step):
            rows = rows_h[start:start + step]
            yield rows.clamp(min=0), rows < 0, blocks_h[start:start + step]


def _forward(qp, kp, vp, tl: Tiles, bs: int, scale: float):
    """Padded ``(B, H, Lp, D)`` inputs -> ``(out, lse)`` padded; empty rows 0 and ``-inf``."""
    assert FLASH is not None  # plain_causal: torch has the fused CPU kernel
    batch, heads, lp, d = qp.shape
    n = batch * heads * lp
    out_d, lse_d = FLASH(_own_blocks(qp, heads, bs), _own_blocks(kp, heads, bs), _own_blocks(vp, heads, bs),
                         0.0, True, scale=scale)[:2]
    m = lse_d.reshape(n).masked_fill(~tl.own, _NEG_INF)  # a row's reference: within _SLACK of its partial lse's maximum
    acc = out_d.reshape(n, d).masked_fill_(~tl.own[:, None], 0.0)  # sum of exp(lse_p - m) out_p
    total = tl.own.to(acc.dtype)  # sum of exp(lse_p - m)
    q_flat, k_blk, v_blk = qp.view(n, d), kp.view(-1, bs, d), vp.view(-1, bs, d)
    for rows, empty, blocks in _batches(tl, bs, d):
        o_t, l_t = FLASH(_take(q_flat, rows), _take(k_blk, blocks), _take(v_blk, blocks), 0.0, False,
                         scale=scale)[:2]
        flat, empty = rows.flatten(), empty.flatten()
        o_t, l_t = o_t.reshape(-1, d), l_t.reshape(-1).masked_fill(empty, _NEG_INF)
        ref = m.index_select(0, flat)
        over = (l_t > ref + _SLACK).nonzero().squeeze(1)  # rows whose reference must rise (none: no pass over acc)
        if over.numel():
            m_new = m.clone().scatter_reduce_(0, flat.index_select(0, over), l_t.index_select(0, over), "amax")
            grew = (m_new > m).nonzero().squeeze(1)  # rescaled rows only
            alpha = torch.where(m[grew] > _NEG_INF, torch.exp(m[grew] - m_new[grew]), 0.0)
            acc.index_copy_(0, grew, acc.index_select(0, grew).mul_(alpha[:, None]))
            total.index_copy_(0, grew, total.index_select(0, grew).mul_(alpha))
            m, ref = m_new, m_new.index_select(0, flat)
        w = torch.exp(l_t - ref.masked_fill_(empty, 0.0))  # at most exp(_SLACK); empty rows: exp(-inf) = 0
        acc.index_add_(0, flat, o_t.mul_(w[:, None]))
        total.index_add_(0, flat, w)
    has = total > 0
    acc.div_(torch.where(has, total, 1.0)[:, None])
    lse = torch.where(has, m + torch.log(torch.where(has, total, 1.0)), _NEG_INF)
    return acc.view(batch, heads, lp, d), lse.view(batch, heads, lp)


def _backward(qp, kp, vp, op, lse, dop, tl: Tiles, bs: int, scale: float):
    """Padded inputs, output, lse and output gradient -> padded ``dq``, ``dk``, ``dv``."""
    assert FLASH_BACKWARD is not None  # plain_causal: torch has the fused CPU kernel
    batch, heads, lp, d = qp.shape
    kv_heads = kp.shape[1]
    n = batch * heads * lp
    lse = torch.where(lse > _NEG_INF, lse, 0.0)  # rows with no key: their output gradient is zeroed below
    do_own = dop.view(n, d) if bool(tl.own.all()) else dop.view(n, d).masked_fill(~tl.own[:, None], 0.0)
    dq, dk_d, dv_d = FLASH_BACKWARD(do_own.view(batch, -1, bs, d), _own_blocks(qp, heads, bs),
                                    _own_blocks(kp, heads, bs), _own_blocks(vp, heads, bs),
                                    op.reshape(batch, -1, bs, d), lse.reshape(batch, -1, bs), 0.0, True,
                                    scale=scale)[:3]
    del do_own
    dq = dq.reshape(n, d).contiguous()
    group = heads // kv_heads
    dk, dv = ((t.reshape(batch, kv_heads, group, lp, d).sum(2) if group > 1 else t).reshape(-1, bs, d).contiguous()
              for t in (dk_d, dv_d))  # contiguous: the tiles' gradients are added into them
    del dk_d, dv_d
    q_flat, o_flat, do_flat, lse_flat = qp.view(n, d), op.view(n, d), dop.view(n, d), lse.view(n)
    k_blk, v_blk = kp.view(-1, bs, d), vp.view(-1, bs, d)
    for rows, empty, blocks in _batches(tl, bs, d):
        do_t = _take(do_flat, rows)
        do_t.view(-1, d).index_fill_(0, empty.flatten().nonzero().squeeze(1), 0.0)  # empty rows add nothing
        dq_t, dk_t, dv_t = FLASH_BACKWARD(do_t, _take(q_flat, rows), _take(k_blk, blocks), _take(v_blk, blocks),
                                          _take(o_flat, rows), _take(lse_flat, rows), 0.0, False, scale=scale)[:3]
        dq.index_add_(0, rows.flatten(), dq_t.reshape(-1, d))
        dk.index_add_(0, blocks, dk_t.squeeze(1))
        dv.index_add_(0, blocks, dv_t.squeeze(1))
    return dq.view(batch, heads, lp, d), dk.view(batch, kv_heads, lp, d), dv.view(batch, kv_heads, lp, d)


class _SelectedPairs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, tl, bs, scale):
        length = q.shape[2]
        lp = -(-length // bs) * bs
        qp, kp, vp = (_padded(t, lp) for t in (q, k, v))
        out, lse = _forward(qp, kp, vp, tl, bs, scale)
        ctx.save_for_backward(qp, kp, vp, out, lse)
        ctx.tl, ctx.bs, ctx.scale, ctx.length = tl, bs, scale, length  # index tensors only: no autograd state
        out, lse = out[:, :, :length], lse[:, :, :length]
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        qp, kp, vp, out, lse = ctx.saved_tensors
        dop = _padded(dout, qp.shape[2])
        dq, dk, dv = _backward(qp, kp, vp, out, lse, dop, ctx.tl, ctx.bs, ctx.scale)
        n = ctx.length
        return dq[:, :, :n], dk[:, :, :n], dv[:, :, :n], None, None, None


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, bs: int, scale: float,
           tl: Tiles | None = None):
    """``(out (B, H, L, D), lse (B, H, L))`` of causal attention over the selected key blocks (the lse carries no
    gradient). ``tl``: the tiles of ``indices`` when already built (:func:`tiles`)."""
    batch, heads, length, _ = q.shape
    if tl is None:
        tl = tiles(indices.to(q.device), batch, heads, k.shape[1], length, bs)
    return _SelectedPairs.apply(q, k, v, tl, bs, scale)


def applies(p: Problem) -> bool:
    """Key blocks selected per query, with :func:`plain_causal`."""
    sel = selection_of(p.mask)
    return sel.block_size > 1 and sel.lengths is None and sel.indices.shape[2] > 1 and plain_causal(p)


def _tiles_of(p: Problem) -> Tiles:
    """The tiles of ``p``'s selection (cached on its mask for these sizes and device)."""
    batch, heads, length = p.sizes[:3]
    sel = selection_of(p.mask)
    key = (batch, heads, p.k.shape[1], length, str(p.q.device), ROWS, STEP)
    return cache.on(p.mask, "pair_tiles", max_entries=4).get_or_build(
        key, lambda: tiles(sel.indices.to(p.q.device), batch, heads, p.k.shape[1], length, sel.block_size))


def _scores(p: Problem) -> tuple[int, int]:
    """Score entries of the own blocks (causal halves and padding included) and of the past-block tiles."""
    batch, heads, length = p.sizes[:3]
    bs = selection_of(p.mask).block_size
    own = batch * heads * (-(-length // bs)) * bs * bs
    return own, sum(rows.numel() for rows in _tiles_of(p).rows) * bs


def density(p: Problem) -> float:
    """The fraction of the ``Lq x Lk`` scores computed: own blocks and the tiles of past blocks."""
    batch, heads, lq, lk = p.sizes[:4]
    return min(1.0, sum(_scores(p)) / max(1, batch * heads * lq * lk))


def describe(p: Problem) -> str:
    tl, bs = _tiles_of(p), selection_of(p.mask).block_size
    lq = p.sizes[2]
    per_query = (tl.pairs * bs) / max(1, p.sizes[0] * p.sizes[1] * lq) + bs / 2
    return (f"selected key blocks read in place, tiled by key block (up to {ROWS} queries per tile, torch's fused "
            f"kernel, recomputed per tile in the backward): L*k = {lq} x {per_query:.0f} keys per query")


def cost(p: Problem, grad: bool = False) -> PathCost:
    """torch's fused kernel over the own blocks and the tiles; the workspace is one batch of tiles and the merge's
    running sums."""
    own, past = _scores(p)
    batch, heads, lq, _, d, dv = p.sizes
    bs = selection_of(p.mask).block_size
    step = max(1, BUDGET // max(1, ROWS * d * 3 + 2 * bs * d))
    workspace = (min(step, max(1, past // (ROWS * bs))) * (ROWS * (2 * d + dv) + 2 * bs * d)
                 + batch * heads * lq * (d + 2)) * itemsize(p)
    return PathCost(own + past, float(workspace), (),
                    fused=fused_attention("attention (selected key blocks, fused kernel per tile)", own + past, d, dv),
                    materialized=False)


def run(p: Problem) -> KernelOutput:
    sel = selection_of(p.mask)
    out, lse = attend(p.q, p.k, p.v, sel.indices, sel.block_size, p.scale, _tiles_of(p))
    return KernelOutput(out, None, lse if p.return_lse else None)
