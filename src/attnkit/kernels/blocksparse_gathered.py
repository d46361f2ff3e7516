"""Path ``blocksparse-gathered``: any score, bias, mask, row normaliser, sinks and dropout on gathered key blocks.

Each slab of the block plan (:mod:`.block_plan`) gathers its key blocks and runs
the shared pipeline (:mod:`.pipeline`) on them: the mask is evaluated at every
gathered entry, padding lanes and unused slots are masked out, and autograd
derives the backward (the gather's backward scatter-adds into the key blocks,
deterministically on CPU). Slabs are checkpointed when the gathered scores kept
for the backward would pass ``BUDGET``.

Masks of kind ``"selected"`` (keys named per query by index tensors: DSA, NSA, MoBA) have no
layout shared by the batch and heads: each query's own keys are gathered instead
(:mod:`.selected`), at a cost proportional to ``Lq * k``.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from ..functional import sinks
from ..functional.validate import Problem
from . import block_plan, rules, selected
from .path_cost import PathCost, Product, itemsize
from .pipeline import (
    KernelOutput,
    block_scores,
    block_weights,
    concat_pieces,
    dropout,
    join_sinks,
    upcast_inputs,
    without_sinks,
)

__all__ = ["refusal", "run", "cost", "density", "describe", "BUDGET"]

BUDGET = 1 << 25  # gathered score elements kept for the backward before slabs are checkpointed


def _normalizer_sees_rows(p: Problem) -> str | None:
    if callable(p.normalize):
        return "custom normalizers would see gathered rows; use the reference or chunked kernel"
    return None


REFUSALS = (rules.full_precision_kv, rules.not_compiling, rules.no_weights, _normalizer_sees_rows)


def refusal(p: Problem) -> str | None:
    return rules.first_refusal(p, REFUSALS)


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
    missing = nq - listed.numel()  # blocks in no slab attend nothing: output 0, lse -inf (the sink's, with one)
    if missing:
        with_lse = pieces[0][1] is not None if pieces else p.return_lse  # softmax gives every slab an lse
        empty = qb.new_full((batch, heads, missing, bs), float("-inf")) if with_lse else None
        if empty is not None and p.sinks is not None:
            empty = sinks.per_row(p.sinks, empty).expand_as(empty)
        pieces.append((qb.new_zeros(batch, heads, missing, bs, vb.shape[-1]), empty))
        seen = torch.zeros(nq, dtype=torch.bool, device=qb.device)
        seen[listed] = True
        listed = torch.cat([listed, (~seen).nonzero().flatten()])
    out, lse = concat_pieces(pieces)
    if not bool((listed == torch.arange(nq, device=listed.device)).all()):  # back to query-block order
        inverse = torch.argsort(listed)
        out, lse = out.index_select(2, inverse), lse.index_select(2, inverse) if lse is not None else None
    return out, lse


@rules.reads_data
def density(p: Problem) -> float:
    """The block plan's density, or the share of the keys a selection names (:func:`.selected.density`)."""
    return selected.density(p) if rules.selected_keys(p) else block_plan.density(p)


def describe(p: Problem) -> str:
    if rules.selected_keys(p):
        return selected.describe(p)
    return "gathered key blocks, any score/bias/normaliser, autograd"


def run(p: Problem) -> KernelOutput:
    if rules.selected_keys(p):
        return selected.run(p)
    if p.sinks is not None and sinks.per_token(p.sinks):  # slabs gather rows: join per-token sinks after them
        inner = without_sinks(p)
        return join_sinks(p, inner, run(inner))
    pl = block_plan.plan_for(p)
    blocks = block_plan.to_blocks(*upcast_inputs(p), pl.bs)
    return block_plan.from_blocks(p, *_general(p, pl.slabs, blocks, pl.bs))


def cost(p: Problem, grad: bool = False) -> PathCost:
    """Both products per slab over its gathered key blocks (padding lanes included); past ``BUDGET`` under
    autograd every slab is checkpointed and its score product runs again in the backward (torch's checkpoint
    stops recomputing once every saved tensor is back, so the output product is not re-run)."""
    if rules.selected_keys(p):
        return selected.cost(p, grad)
    batch, heads, _, lk, d, dv = p.sizes
    pl = block_plan.plan_for(p)
    bs, bh = pl.bs, batch * heads
    computed = pl.computed_blocks * bh * bs * bs
    recompute = grad and computed > BUDGET
    products = []
    for _, idx, _, _ in pl.slabs:
        n, w = idx.shape
        products += [Product("scores (q k^T, active blocks)", bh * n, bs, d, w * bs, "scores", recompute),
                     Product("weights @ v (active blocks)", bh * n, bs, w * bs, dv, "output")]
    workspace = 3.0 * min(computed, BUDGET) * itemsize(p) + 2.0 * bh * lk * (d + dv) * itemsize(p)
    return PathCost(computed, workspace, tuple(products))
