"""Path ``blocksparse-fused``: each slab of query blocks is one call of torch's fused CPU kernel.

A slab is ``n`` query blocks, each with its ``w`` key blocks gathered into a
``(w * bs)``-long row (:mod:`.block_plan`). Seen as attention with ``B*H``
batch elements and ``n`` "heads", every query block is an independent problem
over its own gathered keys, so one call of torch's fused flash kernel (forward
and backward, ``torch.ops.aten._scaled_dot_product_flash_attention_for_cpu``)
computes the slab: scores, mask, softmax and ``P V`` stay in its cache-sized
tiles instead of three passes over a slab of scores in memory.

The mask enters as a float bias ``(1, n, bs, w*bs)`` per slab, ``-inf`` in the
masked entries of partial slots and in the padding slots, ``None`` for a slab
of full slots only. A mask that ignores the batch and head indices gives the
same bias on every call, so the biases are built once and cached on the mask
with its layouts (``BIAS_CACHE`` size-keyed entries per mask, each at most
``BIAS_CACHE_BYTES``); a mask that reads ``b`` or ``h``, or whose biases are
larger, has them built on every call.

Used where the fused kernel computes attnkit's function exactly: softmax of
dot products, no bias, modifier or dropout, ``Dv == D``, finite inputs (torch's
kernel zeroes NaN rows, and a NaN key would leak through an added ``-inf``), and
lse only without autograd (the fused backward takes no lse gradient). A row
with no allowed key gets output 0 and lse 0 from the kernel; lse is set to
``-inf`` there. Otherwise :mod:`.blocksparse_masked` runs.

On several torch threads the slabs run per run of heads, each thread's calls on one
torch thread (:class:`.pipeline.Units`): at 2 threads on a loaded 2-core machine
(``causal() & fixed(512, 32)``, L = 4096) 0.24x SDPA with the dense mask instead of 0.5x.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..functional import sinks
from ..functional.validate import Problem
from ..masks import cache
from . import block_plan, rules
from .block_plan import allowed_in, density, put_query_blocks, query_blocks
from .path_cost import PathCost
from .pipeline import KernelOutput, Units, Workspace, unit_count, upcast_inputs
from .rules import FLASH, FLASH_BACKWARD

__all__ = ["REFUSALS", "refusal", "run", "op_forward", "op_backward", "cost", "density", "slab_biases"]

BIAS_CACHE = 4  # cached (sizes -> biases) entries per mask; the oldest goes first
BIAS_CACHE_BYTES = 1 << 26  # larger bias sets (long, dense layouts) are built per call instead
_NEG_INF = float("-inf")


REFUSALS = (rules.full_precision_kv,
            rules.not_compiling, rules.no_weights, rules.layout_mask, rules.fused_cpu_kernel, rules.fused_cpu_backward,
            rules.softmax_of_dot_products, rules.no_bias, rules.no_dropout, rules.equal_head_dims,
            rules.lse_without_grad, rules.finite_inputs)


def refusal(p: Problem) -> str | None:
    """Why this path cannot run ``p`` exactly (None: it can)."""
    return rules.first_refusal(p, REFUSALS)


def _bias(p: Problem, sl, bs: int, dtype) -> torch.Tensor | None:
    """A slab's float bias ``(B*H | 1, n, bs, w*bs)``: 0 where allowed, ``-inf`` elsewhere; None if all allowed."""
    rows, idx, valid, full_slot = sl
    if bool(full_slot.all()):
        return None
    n, w = idx.shape
    allowed = allowed_in(p, rows, idx, bs) & valid[:, None, :, None].expand(n, 1, w, bs).reshape(n, 1, w * bs)
    batch, heads = allowed.shape[:2]  # 1 where the mask ignores b or h; a key-only mask has no query dim yet
    bias = torch.zeros(batch, heads, n, bs, w * bs, dtype=dtype, device=allowed.device)
    bias.masked_fill_(~allowed, _NEG_INF)
    return bias.view(1, n, bs, w * bs) if batch * heads == 1 else bias.expand(
        p.sizes[0], p.sizes[1], n, bs, w * bs).reshape(-1, n, bs, w * bs)


def slab_biases(p: Problem, slabs, bs: int, dtype) -> list[torch.Tensor | None]:
    """Every slab's bias; cached on the mask when the mask reads neither ``b`` nor ``h``."""
    if p.mask is None or {"b", "h"} & p.mask.uses:
        return [_bias(p, sl, bs, dtype) for sl in slabs]
    key = (block_plan.plan_key(p), dtype)  # the slabs, and so the biases, follow the plan
    return cache.on(p.mask, "fused_biases", max_entries=BIAS_CACHE, max_bytes=BIAS_CACHE_BYTES).get_or_build(
        key, lambda: [_bias(p, sl, bs, dtype) for sl in slabs])


def _gather(ws: Workspace, kb, vb, idx):
    """Key and value blocks of a slab, ``(B*H, n, w*bs, D)``, in reused workspace buffers."""
    batch, heads, _, bs, d = kb.shape
    n, w = idx.shape
    k_g = torch.index_select(kb, 2, idx.flatten(), out=ws.take("k", batch, heads, n * w, bs, d))
    v_g = torch.index_select(vb, 2, idx.flatten(), out=ws.take("v", batch, heads, n * w, bs, d))
    return k_g.view(-1, n, w * bs, d), v_g.view(-1, n, w * bs, d)


def _slab_rows(t, rows):
    """Query blocks ``rows`` of ``(B, H, nq, bs, *)`` as ``(B*H, n, bs, *)`` (a view when consecutive)."""
    return query_blocks(t, rows).reshape(-1, len(rows), *t.shape[3:])


def _heads(bias, batch: int, heads: int, a: int, b: int):
    """A slab's bias for the query heads ``[a, b)``: as it is when shared by all, else their rows."""
    if bias is None or bias.shape[0] == 1 or b - a == heads:
        return bias
    return bias.view(batch, heads, *bias.shape[1:])[:, a:b].reshape(-1, *bias.shape[1:])


def _units(qb, slabs) -> tuple[Units, list[tuple[int, int]]]:
    """Runs of heads ``[a, b)`` (:class:`.pipeline.Units`): each writes its own rows of the outputs and gradients."""
    batch, heads, _, bs, _ = qb.shape
    work = batch * heads * bs * bs * sum(sl[1].numel() for sl in slabs)
    count = unit_count(heads, work)
    return Units(count), [(heads * u // count, heads * (u + 1) // count) for u in range(count)]


def _forward(p: Problem, slabs, biases, qb, kb, vb):
    batch, heads, nq, bs, _ = qb.shape
    out = qb.new_zeros(qb.shape)  # blocks in no slab attend nothing: 0
    lse = qb.new_full((batch, heads, nq, bs), _NEG_INF)
    units, runs = _units(qb, slabs)

    def share() -> None:  # one thread's runs of heads, one fused call per slab
        ws = Workspace(qb)
        for a, b in (runs[u] for u in units.take()):
            for sl, bias in zip(slabs, biases, strict=True):
                rows, n = sl[0], len(sl[0])
                bias = _heads(bias, batch, heads, a, b)
                k_g, v_g = _gather(ws, kb[:, a:b], vb[:, a:b], sl[1])
                o, l_rows = FLASH(_slab_rows(qb[:, a:b], rows), k_g, v_g, 0.0, False, attn_mask=bias, scale=p.scale)
                if p.return_lse and bias is not None:  # rows with no allowed key: the kernel returns lse 0
                    l_rows = l_rows.masked_fill(torch.isneginf(bias).all(-1), _NEG_INF)
                put_query_blocks(out[:, a:b], rows, o.view(batch, b - a, n, bs, -1))
                put_query_blocks(lse[:, a:b], rows, l_rows.view(batch, b - a, n, bs))
    with units.helping(share):
        share()
    return out, lse


def _backward(p: Problem, slabs, biases, qb, kb, vb, out, lse, dout):
    """The fused backward per slab, from the kernel's own lse (under autograd _forward leaves it as returned)."""
    batch, heads, _, bs, d = qb.shape
    dq, dk, dv = torch.zeros_like(qb), torch.zeros_like(kb), torch.zeros_like(vb)
    units, runs = _units(qb, slabs)

    def share() -> None:  # one thread's runs of heads: their key and value rows are their own
        ws = Workspace(qb)
        for a, b in (runs[u] for u in units.take()):
            for sl, bias in zip(slabs, biases, strict=True):
                rows, idx = sl[0], sl[1]
                n, w = idx.shape
                k_g, v_g = _gather(ws, kb[:, a:b], vb[:, a:b], idx)
                dq_r, dk_g, dv_g = FLASH_BACKWARD(
                    _slab_rows(dout[:, a:b], rows), _slab_rows(qb[:, a:b], rows), k_g, v_g,
                    _slab_rows(out[:, a:b], rows), _slab_rows(lse[:, a:b], rows), 0.0, False,
                    attn_mask=_heads(bias, batch, heads, a, b), scale=p.scale)
                put_query_blocks(dq[:, a:b], rows, dq_r.view(batch, b - a, n, bs, d))
                dk[:, a:b].index_add_(2, idx.flatten(), dk_g.reshape(batch, b - a, n * w, bs, d))
                dv[:, a:b].index_add_(2, idx.flatten(), dv_g.reshape(batch, b - a, n * w, bs, d))
    with units.helping(share):
        share()
    return dq, dk, dv


class _FusedBlockSparse(torch.autograd.Function):
    """With sinks, the slabs' ``(out, lse)`` are joined with them and the fused backward runs from the joined
    pair, which rebuilds the sink call's probabilities (:mod:`attnkit.functional.sinks`)."""

    @staticmethod
    def forward(ctx, qb, kb, vb, sink_logits, p: Problem, slabs, biases):
        out, lse = _forward(p, slabs, biases, qb, kb, vb)
        if sink_logits is not None:
            out, lse = sinks.joined(out, lse, sink_logits)
        ctx.save_for_backward(qb, kb, vb, out, lse, sink_logits)
        ctx.p, ctx.slabs, ctx.biases = p, slabs, biases
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, _dlse):  # the rules refuse lse under autograd: _dlse is never used
        qb, kb, vb, out, lse, sink_logits = ctx.saved_tensors
        dout = dout.contiguous()
        dsinks = sinks.kernel_gradient(dout, out, lse, sink_logits) if ctx.needs_input_grad[3] else None
        return (*_backward(ctx.p, ctx.slabs, ctx.biases, qb, kb, vb, out, lse, dout), dsinks, None, None, None)


def backward_differentiable(p: Problem) -> bool:
    """Its backward is written by hand: a second derivative recomputes the call (pipeline.twice_differentiable)."""
    return False


def run(p: Problem) -> KernelOutput:
    pl = block_plan.plan_for(p)
    qb, kb, vb = block_plan.to_blocks(*upcast_inputs(p), pl.bs)
    biases = slab_biases(p, pl.slabs, pl.bs, qb.dtype)
    blocked = None if p.sinks is None else sinks.to_blocks(p.sinks, pl.bs, p.sizes[2])
    out, lse = _FusedBlockSparse.apply(qb, kb, vb, blocked, p, pl.slabs, biases)
    return block_plan.from_blocks(p, out, lse if p.return_lse else None)


def op_forward(p: Problem):
    """For the compiled operator: out ``(B, H, Lq, Dv)`` and the kernel's own lse ``(B, H, Lq)`` (0 on rows with
    no key), without autograd."""
    pl = block_plan.plan_for(p)
    qb, kb, vb = block_plan.to_blocks(*upcast_inputs(p), pl.bs)
    out, lse = _forward(p, pl.slabs, slab_biases(p, pl.slabs, pl.bs, qb.dtype), qb, kb, vb)
    return block_plan.from_blocks(p, out, lse)[::2]


def op_backward(p: Problem, out, lse, dout):
    """For the compiled operator: ``dq, dk, dv`` (key/value heads repeated for grouped queries) from
    :func:`op_forward`'s output and lse."""
    pl = block_plan.plan_for(p)
    q, k, v = upcast_inputs(p)
    qb, kb, vb = block_plan.to_blocks(q, k, v, pl.bs)
    outb, doutb, lseb = block_plan.to_blocks(out, dout.to(out.dtype), lse[..., None], pl.bs)
    biases = slab_biases(p, pl.slabs, pl.bs, qb.dtype)
    grads = _backward(p, pl.slabs, biases, qb, kb, vb, outb.contiguous(), lseb[..., 0], doutb.contiguous())
    return tuple(g.flatten(2, 3)[:, :, :t.shape[2]] for g, t in zip(grads, (q, k, v), strict=True))


def cost(p: Problem, grad: bool = False) -> PathCost:
    return block_plan.softmax_cost(p, "attention (active blocks, fused kernel per slab)")
