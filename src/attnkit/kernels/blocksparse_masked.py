"""Path ``blocksparse-masked``: plain softmax attention on gathered key blocks, masked slot by slot,
backward by hand.

A slab is ``n`` query blocks, each with its ``w`` key blocks gathered into a
``(w * bs)``-long row (:mod:`.block_plan`). The layout's ``full`` flags say which
slots need no mask (every entry allowed), so the mask is evaluated only in the
partial slots, and slots that pad a row to the slab's width are set to ``-inf``
as a whole: for block layouts (BigBird, random layouts) no entry is evaluated,
for strides and segments only the boundary blocks. Masking is by select, so NaN
in a masked key cannot leak; torch's fused softmax normalises whole rows.

The backward (Dao 2023, arXiv:2307.08691, Alg. 2) recomputes each slab's
probabilities and scatter-adds the key and value gradients into one buffer
(``index_add_``, deterministic on CPU): nothing gathered is kept between the
passes, and no per-slab buffer the size of K is allocated.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..functional.validate import Problem
from . import block_plan, rules
from .block_plan import allowed_in, density, put_query_blocks, query_blocks
from .path_cost import PathCost
from .pipeline import KernelOutput, Workspace, join_sinks, upcast_inputs, without_sinks

__all__ = ["refusal", "run", "cost", "density"]

_NEG_INF = float("-inf")


REFUSALS = (rules.full_precision_kv,
            rules.not_compiling, rules.no_weights, rules.layout_mask, rules.softmax_of_dot_products, rules.no_bias,
            rules.no_dropout)


def refusal(p: Problem) -> str | None:
    """Softmax of (scaled) dot products, no bias, modifier or dropout: the mask is the only source of ``-inf``."""
    return rules.first_refusal(p, REFUSALS)


def _mask_(p: Problem, s, sl, bs: int, value: float) -> None:
    """Write ``value`` into the masked entries of a slab's scores ``s (B, H, n, bs, w*bs)``, in place.

    Mostly partial slabs (dilated windows, strides) evaluate the mask on the whole slab;
    otherwise only the partial slots are gathered, masked and written back, and padding
    slots are filled whole.
    """
    rows, idx, valid, full_slot = sl
    partial = valid & ~full_slot
    n_partial = int(partial.sum())
    if n_partial * 4 > partial.numel():
        slot_ok = valid[None, None, :, None, :, None].expand(1, 1, *idx.shape[:1], 1, idx.shape[1], bs)
        allowed = allowed_in(p, rows, idx, bs) & slot_ok.flatten(-2)
        s.masked_fill_(~allowed, value)
        return
    s6 = s.view(*s.shape[:3], bs, idx.shape[1], bs)
    pad_r, pad_c = (~valid).nonzero(as_tuple=True)
    if len(pad_r):
        s6[:, :, pad_r, :, pad_c, :] = value
    if n_partial:
        part_r, part_c = partial.nonzero(as_tuple=True)
        allowed = allowed_in(p, rows[part_r], idx[part_r, part_c, None], bs)  # (B|1, H|1, P, bs, bs)
        sub = s6[:, :, part_r, :, part_c, :]  # (P, B, H, bs, bs): advanced indices come first
        s6[:, :, part_r, :, part_c, :] = sub.masked_fill_(~allowed.permute(2, 0, 1, 3, 4), value)


def _rows_into(ws: Workspace, name: str, t, rows):
    """Query blocks ``rows`` of ``(B, H, nq, bs, E)`` copied into a contiguous workspace buffer."""
    buf = ws.take(name, *t.shape[:2], len(rows), *t.shape[3:])
    first = int(rows[0])
    if int(rows[-1]) - first == len(rows) - 1:
        return buf.copy_(t[:, :, first:first + len(rows)])
    return torch.index_select(t, 2, rows, out=buf)


def _inputs(ws: Workspace, p: Problem, sl, qb, kb, vb):
    """``(q_rows * scale, k_g, v_g)`` of a slab as 3-D bmm operands ``(B*H*n, bs, D), (B*H*n, w*bs, D|Dv)``."""
    rows, idx = sl[0], sl[1]
    batch, heads, _, bs, d = qb.shape
    n, w = idx.shape
    qs = _rows_into(ws, "q", qb, rows).mul_(p.scale).view(-1, bs, d)
    k_g = torch.index_select(kb, 2, idx.flatten(), out=ws.take("k", batch, heads, n * w, bs, d))
    v_g = torch.index_select(vb, 2, idx.flatten(), out=ws.take("v", batch, heads, n * w, bs, vb.shape[-1]))
    return qs, k_g.view(-1, w * bs, d), v_g.view(-1, w * bs, vb.shape[-1])


def _probs(ws: Workspace, p: Problem, sl, qs, k_g, bs: int, need_max: bool = False):
    """Probabilities ``(B, H, n, bs, w*bs)`` of a slab (a workspace buffer) and the masked row max (or None)."""
    batch, heads = p.sizes[:2]
    full_slot = sl[3]
    s = torch.bmm(qs, k_g.transpose(1, 2), out=ws.take("s", *qs.shape[:2], k_g.shape[1]))
    s = s.view(batch, heads, -1, bs, k_g.shape[1])
    _mask_(p, s, sl, bs, _NEG_INF)
    m = s.amax(-1) if need_max or not bool(full_slot.any(1).all()) else None
    torch.ops.aten._softmax.out(s, -1, False, out=s)  # fused and in place; no slow exp(-inf) path
    if m is not None and bool((m == _NEG_INF).any()):
        empty = m == _NEG_INF
        if not (p.finiteness_known and p.inputs_finite()):  # infinite q or k may have made a row all -inf
            empty &= ~_keyed(p, s, sl, bs)
        s.masked_fill_(empty[..., None], 0.0)  # rows with no key: softmax gave NaN, the output is 0
    return s, m


def _keyed(p: Problem, s, sl, bs: int):
    """Rows ``(B, H, n, bs)`` of a slab that the mask leaves a key: an all ``-inf`` row among them got its ``-inf``
    from infinite q or k, and stays NaN (RELIABILITY row 21). Read only when a row's max is ``-inf``."""
    probe = torch.zeros_like(s)
    _mask_(p, probe, sl, bs, _NEG_INF)
    return probe.amax(-1) == 0


def _forward(p: Problem, slabs, qb, kb, vb, bs: int):
    batch, heads, nq = qb.shape[:3]
    out = qb.new_zeros(batch, heads, nq, bs, vb.shape[-1])  # blocks in no slab attend nothing: 0
    lse = qb.new_full((batch, heads, nq, bs), _NEG_INF) if p.return_lse else None
    ws = Workspace(qb)
    for sl in slabs:
        qs, k_g, v_g = _inputs(ws, p, sl, qb, kb, vb)
        probs, m = _probs(ws, p, sl, qs, k_g, bs, need_max=p.return_lse)
        o = torch.bmm(probs.view(-1, bs, v_g.shape[1]), v_g, out=ws.take("o", qs.shape[0], bs, v_g.shape[2]))
        put_query_blocks(out, sl[0], o.view(batch, heads, -1, bs, v_g.shape[2]))
        if p.return_lse:  # the largest probability is exp(0) / sum: lse = m + log(sum); -inf rows stay -inf
            put_query_blocks(lse, sl[0], torch.where(m == _NEG_INF, m, m - torch.log(probs.amax(-1))))
    return out, lse


def _backward(p: Problem, slabs, qb, kb, vb, out, dout, dlse, bs: int):
    batch, heads = p.sizes[:2]
    delta = (dout * out).sum(-1)  # (B, H, nq, bs): rowsum(dO * O)
    if dlse is not None:
        delta = delta - dlse  # d lse / d s = P: the same term
    dq, dk, dv = torch.zeros_like(qb), torch.zeros_like(kb), torch.zeros_like(vb)
    finite, ws = p.inputs_finite(), Workspace(qb)
    for sl in slabs:
        rows, flat_idx = sl[0], sl[1].flatten()
        qs, k_g, v_g = _inputs(ws, p, sl, qb, kb, vb)
        probs, _ = _probs(ws, p, sl, qs, k_g, bs)
        if not finite:
            _mask_(p, probs, sl, bs, 0.0)  # a NaN row must not reach keys it does not attend
        p3 = probs.view(-1, bs, k_g.shape[1])
        d_o = _rows_into(ws, "do", dout, rows).view(-1, bs, dout.shape[-1])
        dv_g = torch.bmm(p3.transpose(1, 2), d_o, out=ws.take("dkv", *v_g.shape))
        dv.index_add_(2, flat_idx, dv_g.view(batch, heads, -1, bs, v_g.shape[2]))
        ds = torch.bmm(d_o, v_g.transpose(1, 2), out=ws.take("ds", *p3.shape)).view(probs.shape)
        ds.sub_(query_blocks(delta, rows)[..., None]).mul_(probs)
        if not finite:
            _mask_(p, ds, sl, bs, 0.0)  # select: 0 * NaN from a masked value cannot leak
        ds3 = ds.view(p3.shape)
        dq_rows = torch.bmm(ds3, k_g, out=ws.take("dq", *qs.shape)).mul_(p.scale)
        put_query_blocks(dq, rows, dq_rows.view(batch, heads, -1, bs, qs.shape[2]))
        dk_g = torch.bmm(ds3.transpose(1, 2), qs, out=ws.take("dkv", *k_g.shape))
        dk.index_add_(2, flat_idx, dk_g.view(batch, heads, -1, bs, k_g.shape[2]))
    return dq, dk, dv


class _BlockSparseSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qb, kb, vb, p: Problem, slabs, bs: int):
        out, lse = _forward(p, slabs, qb, kb, vb, bs)
        ctx.save_for_backward(qb, kb, vb, out)
        ctx.p, ctx.slabs, ctx.bs = p, slabs, bs
        return out, (lse if lse is not None else out.new_empty(0))

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dlse):
        qb, kb, vb, out = ctx.saved_tensors
        dlse = dlse if dlse is not None and dlse.numel() else None
        dq, dk, dv = _backward(ctx.p, ctx.slabs, qb, kb, vb, out, dout.contiguous(), dlse, ctx.bs)
        return dq, dk, dv, None, None, None


def backward_differentiable(p: Problem) -> bool:
    """Its backward is written by hand: a second derivative recomputes the call (pipeline.twice_differentiable)."""
    return False


def run(p: Problem) -> KernelOutput:
    if p.sinks is not None:  # joined with the output and lse; the backward takes the lse gradient
        inner = without_sinks(p)
        return join_sinks(p, inner, run(inner))
    pl = block_plan.plan_for(p)
    blocks = block_plan.to_blocks(*upcast_inputs(p), pl.bs)
    out, lse = _BlockSparseSoftmax.apply(*blocks, p, pl.slabs, pl.bs)
    return block_plan.from_blocks(p, out, lse if p.return_lse else None)


def cost(p: Problem, grad: bool = False) -> PathCost:
    return block_plan.softmax_cost(p, "attention (active blocks)")
