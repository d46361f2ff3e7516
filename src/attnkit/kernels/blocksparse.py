"""The block-sparse kernel: computes only the (query block, key block) pairs a mask allows.

The mask's :class:`~attnkit.masks.BlockLayout` says which key blocks each query
block may touch. For query block ``I`` the active key blocks ``J_1..J_w`` are
gathered into one ``(w * bs)``-long key row, so attention is a batched matmul
over ``(nq, bs) x (w * bs)`` scores: ``O(L * w * bs * D)`` work and memory,
never ``O(Lq Lk)``. Partial blocks are exact (the mask is evaluated there);
padding lanes and unused slots are masked out. With no mask the layout is full.

Query blocks are sorted by how many key blocks they touch and cut into slabs of
about ``SLAB`` scores, each computed at its widest row's width, so a few wide
rows (global tokens) never widen the others. Three paths:

- bands (sliding windows, ``lo <= j - i <= hi``): :mod:`.window_band` reads each
  block's contiguous key window in place, no gathers;
- softmax of dot products: :mod:`.blocksparse_fused` runs each slab as one call of
  torch's fused CPU kernel with the partial slots' mask as a cached bias; where it
  cannot (non-finite inputs, ``Dv != D``, lse under autograd) :mod:`.blocksparse_softmax`
  evaluates the mask only in blocks the layout does not mark full, with a hand-written backward;
- anything else (scores, biases, row normalisers, dropout): the mask at every
  gathered entry, autograd for the backward (the gather's backward scatter-adds
  into the key blocks, deterministically on CPU), slabs checkpointed past ``BUDGET``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..functional.masks import full as full_mask
from ..functional.validate import Problem
from . import blocksparse_fused, blocksparse_softmax, window_band
from .common import KernelOutput, block_scores, block_weights, concat_pieces, dropout, upcast_inputs

NAME = "blocksparse"
BLOCK_SIZES = (64, 128)
SLAB = 1 << 21  # gathered score elements per slab: few large ops; temporaries small enough to reuse
BUDGET = 1 << 25  # gathered score elements kept for the backward before slabs are checkpointed


def refusal(p: Problem) -> str | None:
    if torch.compiler.is_compiling():
        return "under torch.compile: block layouts are data-dependent"
    if p.return_weights:
        return "never builds the dense (Lq, Lk) weights that return_weights asks for"
    if callable(p.normalize):
        return "custom normalizers would see gathered rows; use the reference or chunked kernel"
    return None


def describe(p: Problem) -> str:
    """Which of the kernel's paths runs ``p`` (explain() shows it)."""
    if window_band.refusal(p) is None:
        pl = window_band.plan(p)
        return f"band windows of {pl.width} keys per block of {pl.bs} queries, read in place (no gathers)"
    if blocksparse_fused.applies(p) is None:
        return "gathered key blocks, one fused torch kernel call per slab, the partial blocks' mask as a cached bias"
    if blocksparse_softmax.applies(p):
        return "gathered key blocks, the mask evaluated only in partial blocks, backward by hand"
    return "gathered key blocks, the mask evaluated at every entry, autograd backward"


def layouts(p: Problem, bs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(active, full)`` ``(nq, nk)`` for all batch elements and heads at once (layouts are cached on the mask).

    ``active``: some element or head may attend somewhere in the block; ``full``: every
    in-range entry is allowed for every element and head. A last key block that runs
    past ``Lk`` is never full, so its padding lanes are masked.
    """
    batch, heads, lq, lk, _, _ = p.sizes
    mask = p.mask if p.mask is not None else full_mask()
    layout = mask.block_layout(lq, lk, bs, device=p.q.device, batch=batch, heads=heads)
    active, full = layout.active.any(0).any(0), layout.full.all(0).all(0) & layout.active.any(0).any(0)
    if lk % bs:
        full = full.clone()
        full[:, -1] = False
    return active, full


def union_layout(p: Problem, bs: int) -> torch.Tensor:
    """Active blocks ``(nq, nk)`` for any batch element or head (layouts are cached on the mask)."""
    return layouts(p, bs)[0]


def choose_block_size(p: Problem) -> int:
    """The block size with the fewest computed score entries (layouts are cached on the mask)."""
    def cost(bs):
        computed = sum(len(rows) * width for rows, width in width_groups(union_layout(p, bs))) * bs * bs
        return computed * (1 + 16 / bs)  # per-block overhead favours larger blocks
    return min(BLOCK_SIZES, key=cost)


def width_groups(active: torch.Tensor, rows_cost: int = 1) -> list[tuple[torch.Tensor, int]]:
    """The slabs of query blocks and their widths ``[(block ids, width)]``, as :func:`run` computes them.

    Blocks are sorted by how many key blocks they touch, and every block of a slab is
    computed at the slab's width (its widest), so a few wide rows (global tokens) never
    widen the others: a slab ends where the width falls below 3/4 of its widest, or at
    ``SLAB`` scores (``rows_cost`` = score elements per block and key block, ``B*H*bs*bs``).
    Blocks that touch no key block are in no slab (their output is 0).
    """
    counts = active.sum(1)
    order = torch.argsort(counts, descending=True, stable=True)
    widths = counts[order].tolist()
    groups, first = [], 0
    while first < len(widths) and widths[first] > 0:
        stop, limit = first + 1, first + max(1, SLAB // (rows_cost * widths[first]))
        while stop < min(len(widths), limit) and widths[stop] * 4 >= widths[first] * 3:
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


def _pad_to(t: torch.Tensor, length: int) -> torch.Tensor:
    return F.pad(t, (0, 0, 0, length - t.shape[2])) if t.shape[2] != length else t


def _slab(p: Problem, rows, q_rows, k_g, v_g, idx, valid, bs: int):
    """Any score, bias, mask and row normaliser: the mask is evaluated at every gathered entry."""
    batch, heads, lq, lk, _, _ = p.sizes
    n, w = idx.shape
    lane = torch.arange(bs, device=idx.device)
    kv_idx = (idx[:, :, None] * bs + lane).view(1, 1, n, 1, w * bs)
    q_idx = (rows[:, None] * bs + lane).view(1, 1, n, bs, 1)
    kv_valid = valid[:, :, None].expand(n, w, bs).reshape(1, 1, n, 1, w * bs) & (kv_idx < lk)
    b = torch.arange(batch, device=idx.device).view(-1, 1, 1, 1, 1)
    h = torch.arange(heads, device=idx.device).view(1, -1, 1, 1, 1)
    # Padding lanes (past Lq or Lk) read the last real index: kv_valid masks them, padded rows are dropped.
    scores, allowed = block_scores(p, q_rows, k_g, b, h, q_idx.clamp(max=max(lq - 1, 0)),
                                   kv_idx.clamp(max=max(lk - 1, 0)), kv_valid)
    weights, lse = block_weights(p, scores, allowed)
    return dropout(p, weights) @ v_g, lse  # (B, H, n, bs, Dv)


def _is_range(rows: torch.Tensor) -> bool:
    """True when block ids are consecutive, so a slice (a view) can stand for a gather (a copy)."""
    return rows.numel() > 0 and int(rows[-1]) - int(rows[0]) == rows.numel() - 1


def _compute(p: Problem, rows, qb, kb, vb, idx, valid, bs: int):
    """One slab of the general path: gather its key blocks, evaluate the mask at every entry."""
    n, w = idx.shape
    k_g = kb.index_select(2, idx.flatten()).view(*kb.shape[:2], n, w * bs, kb.shape[-1])  # (B, H, n, w*bs, D)
    v_g = vb.index_select(2, idx.flatten()).view(*vb.shape[:2], n, w * bs, vb.shape[-1])  # (B, H, n, w*bs, Dv)
    q_rows = qb[:, :, int(rows[0]):int(rows[0]) + n] if _is_range(rows) else qb.index_select(2, rows)
    return _slab(p, rows, q_rows, k_g, v_g, idx, valid, bs)


def _general(p: Problem, slabs, blocks, bs: int):
    """Any score, bias, normaliser and dropout, through autograd; slabs checkpointed past ``BUDGET``."""
    batch, heads = p.sizes[:2]
    qb, kb, vb = blocks
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in blocks)
    checkpointed = grad and sum(idx.numel() for _, idx, _, _ in slabs) * batch * heads * bs * bs > BUDGET
    pieces = []
    for rows, idx, valid, _ in slabs:
        args = (p, rows, qb, kb, vb, idx, valid, bs)
        pieces.append(checkpoint(_compute, *args, use_reentrant=False) if checkpointed else _compute(*args))
    nq = qb.shape[2]
    listed = torch.cat([rows for rows, _, _, _ in slabs]) if slabs else qb.new_zeros(0, dtype=torch.long)
    missing = nq - listed.numel()  # blocks in no slab attend nothing: output 0, lse -inf
    if missing:
        pieces.append((qb.new_zeros(batch, heads, missing, bs, vb.shape[-1]),
                       qb.new_full((batch, heads, missing, bs), float("-inf")) if p.return_lse else None))
        seen = torch.zeros(nq, dtype=torch.bool, device=qb.device)
        seen[listed] = True
        listed = torch.cat([listed, (~seen).nonzero().flatten()])
    out, lse = concat_pieces(pieces)
    if not bool((listed == torch.arange(nq, device=listed.device)).all()):  # back to query-block order
        inverse = torch.argsort(listed)
        out, lse = out.index_select(2, inverse), lse.index_select(2, inverse) if lse is not None else None
    return out, lse


def plan(p: Problem, bs: int):
    """Slabs ``(rows, idx (n, w), valid (n, w), full_slot (n, w))`` of query blocks for a block size."""
    active, full = layouts(p, bs)
    slabs = []
    for rows, width in width_groups(active, p.sizes[0] * p.sizes[1] * bs * bs):
        idx, valid = gather_plan(active[rows], width)
        slabs.append((rows, idx, valid, torch.gather(full[rows], 1, idx) & valid))
    return slabs


def run(p: Problem) -> KernelOutput:
    if window_band.refusal(p) is None:  # a band: contiguous key windows, no gathers
        out, lse = window_band.run(p)
        return KernelOutput(out, None, lse)
    q, k, v = upcast_inputs(p)
    batch, heads, lq, lk, d, dv = p.sizes
    bs = choose_block_size(p)
    nq, nk = -(-lq // bs), -(-lk // bs)
    blocks = (_pad_to(q, nq * bs).view(batch, heads, nq, bs, d), _pad_to(k, nk * bs).view(batch, heads, nk, bs, d),
              _pad_to(v, nk * bs).view(batch, heads, nk, bs, dv))
    slabs = plan(p, bs)
    if blocksparse_fused.applies(p) is None:
        out, lse = blocksparse_fused.run(p, slabs, *blocks, bs)
    elif blocksparse_softmax.applies(p):
        out, lse = blocksparse_softmax.run(p, slabs, *blocks, bs)
    else:
        out, lse = _general(p, slabs, blocks, bs)
    out = out.reshape(batch, heads, nq * bs, dv)[:, :, :lq]
    lse = lse.reshape(batch, heads, nq * bs)[:, :, :lq] if lse is not None else None
    return KernelOutput(out, None, lse)
