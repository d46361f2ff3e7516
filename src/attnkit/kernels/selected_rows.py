"""Causal attention over per-query selected keys (DSA's top-k), one fused-kernel row per query: ``O(Lq k D)``.

DeepSeek-AI 2025, arXiv:2512.02556, eq. 2: query ``t`` attends the keys ``S_t`` its indexer chose::

    out_t = softmax_{j in S_t, j <= t}(q_t k_j^T * scale) V[S_t]

A chunk of queries at a time (``BUDGET`` gathered elements), each query's ``k`` keys and values
are gathered for its heads and the chunk is one call of torch's fused kernel with the queries as
its batch (one query row each, a float mask for unused slots and later keys). Nothing
``Lq x Lk`` exists. The backward (a custom ``autograd.Function``) gathers the chunk again and
runs torch's fused backward with the saved output and lse; the keys' and values' gradients
are added back at the keys' rows.

Shapes: ``q`` ``(B, H, L, D)``, ``k`` / ``v`` ``(B, H_kv, L, D)``, ``indices`` ``(B|1, 1, L, n)``
distinct key positions (``-1``: unused), shared by every head.
"""

from __future__ import annotations

import torch

from ..functional.validate import Problem
from ..masks.selected import selection_of
from .path_cost import PathCost, fused_attention, itemsize
from .pipeline import KernelOutput
from .rules import FLASH, FLASH_BACKWARD
from .selected_pairs import plain_causal

__all__ = ["applies", "run", "density", "cost", "describe", "attend", "BUDGET"]

BUDGET = 1 << 23  # gathered key and value elements per chunk of queries
_NEG_INF = float("-inf")


def _chunks(batch: int, heads: int, length: int, n: int, d: int):
    rows = max(1, BUDGET // max(1, 2 * heads * n * d))
    for r0 in range(0, batch * length, rows):
        yield r0, min(batch * length, r0 + rows)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``(B, H, L, E)`` -> ``(B L, H E)``: a position's heads in one row."""
    return t.permute(0, 2, 1, 3).reshape(t.shape[0] * t.shape[2], -1)


def _gather(q, q_flat, k_flat, v_flat, kv_heads: int, idx, r0: int, r1: int):
    """Flat queries ``[r0, r1)`` (over ``(B, L)``): ``q (c, H, 1, D)``, keys and values ``(c, H, n, D)``, the
    float mask ``(c, 1, 1, n)``, the key rows ``(c, n)`` (flat over ``(B, L)``) and which queries see a key."""
    _, heads, length, d = q.shape
    dev = q.device
    flat = torch.arange(r0, r1, device=dev)
    b, t = flat // length, flat % length
    sel = idx[b if idx.shape[0] > 1 else torch.zeros_like(b), 0, t]  # (c, n)
    real = (sel >= 0) & (sel <= t[:, None])
    has = real.any(-1)
    key_rows = b[:, None] * length + sel.clamp(0, length - 1)
    q_c = q_flat[r0:r1].view(r1 - r0, heads, 1, d)

    def take(t_):
        g = t_.index_select(0, key_rows.flatten())
        g = g.view(r1 - r0, -1, kv_heads, d).transpose(1, 2)  # (c, H_kv, n, D)
        return g.repeat_interleave(heads // kv_heads, 1) if kv_heads != heads else g  # the kernel reads strides
    mask = torch.zeros(real.shape, dtype=q.dtype, device=dev).masked_fill_(~real, _NEG_INF)
    mask[:, 0].masked_fill_(~has, 0.0)  # a query with no key reads slot 0; its output is zeroed after
    return q_c, take(k_flat), take(v_flat), mask[:, None, None], key_rows, has


def _forward(q, k, v, idx, scale):
    batch, heads, length, d = q.shape
    out = q.new_zeros(batch * length, heads, d)
    lse = q.new_full((batch * length, heads), _NEG_INF)
    q_flat, k_flat, v_flat = _flat(q), _flat(k), _flat(v)
    for r0, r1 in _chunks(batch, heads, length, idx.shape[-1], d):
        q_c, k_g, v_g, mask, _, has = _gather(q, q_flat, k_flat, v_flat, k.shape[1], idx, r0, r1)
        o, l_ = FLASH(q_c, k_g, v_g, 0.0, False, attn_mask=mask, scale=scale)[:2]
        out[r0:r1] = o.squeeze(2).masked_fill(~has[:, None, None], 0.0)
        lse[r0:r1] = l_.squeeze(2).masked_fill(~has[:, None], _NEG_INF)
    return (out.view(batch, length, heads, d).transpose(1, 2).contiguous(),
            lse.view(batch, length, heads).transpose(1, 2).contiguous())


def _backward(q, k, v, idx, out, lse, dout, scale):
    batch, heads, length, d = q.shape
    kv_heads = k.shape[1]
    dq = q.new_zeros(batch * length, heads, d)
    dk, dv = (k.new_zeros(batch * length, kv_heads * d) for _ in range(2))
    o_flat = out.permute(0, 2, 1, 3).reshape(batch * length, heads, d)
    do_flat = dout.permute(0, 2, 1, 3).reshape(batch * length, heads, d)
    l_flat = lse.transpose(1, 2).reshape(batch * length, heads)
    q_flat, k_flat, v_flat = _flat(q), _flat(k), _flat(v)
    for r0, r1 in _chunks(batch, heads, length, idx.shape[-1], d):
        q_c, k_g, v_g, mask, key_rows, has = _gather(q, q_flat, k_flat, v_flat, kv_heads, idx, r0, r1)
        do_c = do_flat[r0:r1].masked_fill(~has[:, None, None], 0.0).unsqueeze(2)
        l_c = torch.where(has[:, None], l_flat[r0:r1], 0.0).unsqueeze(2)
        dq_c, dk_g, dv_g = FLASH_BACKWARD(do_c, q_c, k_g, v_g, o_flat[r0:r1].unsqueeze(2), l_c, 0.0, False,
                                          attn_mask=mask, scale=scale)[:3]
        dq[r0:r1] = dq_c.squeeze(2)
        for t_, g in ((dk, dk_g), (dv, dv_g)):
            if heads != kv_heads:
                g = g.reshape(r1 - r0, kv_heads, heads // kv_heads, -1, d).sum(2)  # (c, H_kv, n, D)
            t_.index_add_(0, key_rows.flatten(), g.permute(0, 2, 1, 3).reshape(-1, kv_heads * d))
    return (dq.view(batch, length, heads, d).transpose(1, 2), dk.view(batch, length, kv_heads, d).transpose(1, 2),
            dv.view(batch, length, kv_heads, d).transpose(1, 2))


class _SelectedRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, idx, scale):
        out, lse = _forward(q, k, v, idx, scale)
        ctx.save_for_backward(q, k, v, idx, out, lse)
        ctx.scale = scale
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        q, k, v, idx, out, lse = ctx.saved_tensors
        return (*_backward(q, k, v, idx, out, lse, dout, ctx.scale), None, None)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, scale: float):
    """``(out (B, H, L, D), lse (B, H, L))`` of causal attention over each query's selected keys."""
    return _SelectedRows.apply(q, k, v, indices.to(q.device), scale)


def applies(p: Problem) -> bool:
    """Single selected keys shared by the heads (``indices`` ``(B|1, 1, L, n)``) with a causal mask, otherwise as
    :func:`.selected_pairs.applies`."""
    sel = selection_of(p.mask)
    return (sel.block_size == 1 and sel.lengths is None and sel.indices.shape[2] > 1 and sel.indices.shape[1] == 1
            and plain_causal(p))


def density(p: Problem) -> float:
    return min(1.0, selection_of(p.mask).indices.shape[-1] / max(1, p.sizes[3]))


def describe(p: Problem) -> str:
    n = selection_of(p.mask).indices.shape[-1]
    return (f"selected keys gathered per query, torch's fused kernel with one query row per batch entry "
            f"(recomputed in the backward): L*k = {p.sizes[2]} x {n} keys")


def cost(p: Problem, grad: bool = False) -> PathCost:
    batch, heads, lq, _, d, dv = p.sizes
    n = selection_of(p.mask).indices.shape[-1]
    pairs = batch * heads * lq * n
    return PathCost(pairs, float(min(BUDGET, 2 * pairs * d) * itemsize(p)), (),
                    fused=fused_attention("attention (selected keys, fused kernel per query)", pairs, d, dv),
                    materialized=False)


def run(p: Problem) -> KernelOutput:
    out, lse = attend(p.q, p.k, p.v, selection_of(p.mask).indices, p.scale)
    return KernelOutput(out, None, lse if p.return_lse else None)
