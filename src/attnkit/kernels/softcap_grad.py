"""Backward of :mod:`.softcap_loop`: FlashAttention-2's backward through ``cap * tanh``.

Dao 2023 (arXiv:2307.08691, Alg. 2), per block of heads, rows and keys, from the saved
``lse`` (which includes the fixed shift)::

    T = tanh(q' K^T);  P = exp(cap * T - lse)          (q' = q * scale / cap)
    dV += P^T dO;  dS = P * (dO V^T - D + dlse),  D = rowsum(dO * O)
    dT = dS * cap * (1 - T^2);  dQ = dT K * scale / cap;  dK += dT^T Q * scale / cap

``T`` and ``P`` are computed as in the forward (the cheapest approximant of ``tanh``
the block's range admits, one fused multiply-add and ``exp2``), ``T`` kept: the
derivative ``1 - T^2`` comes from it, and ``dS (1 - T^2)`` is one pass
(``aten.tanh_backward``, in place); the block temporaries live in one workspace;
products accumulate with ``baddbmm`` (``out=``: FlopCounterMode counts it as a matmul);
``cap`` is applied to ``dQ`` and ``dK`` once at the end. ``dlse`` is the gradient reaching the returned
log-sum-exp (``d lse / d s = P``). Masked pairs have ``P = 0``; a row with no
allowed key has ``lse = -inf``, which is replaced by 0 before the subtraction
(all its ``P`` are masked to 0 anyway).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .pipeline import Workspace

__all__ = ["SoftcapAttention"]

BACKWARD_BLOCKS = (256, 256, 1 << 18)  # (query rows, keys, score elements) per block; softcap_loop.FORWARD_BLOCKS

_tanh_backward = torch.ops.aten.tanh_backward.grad_input  # grad * (1 - t^2), one pass


def _accumulate(first: bool, dst, a, b):
    """``dst = a @ b`` on the first block, else ``dst += a @ b`` (one matmul either way)."""
    return torch.bmm(a, b, out=dst) if first else torch.baddbmm(dst, a, b, out=dst)


class SoftcapAttention(torch.autograd.Function):
    """``apply(blocks, q, k, v) -> (out, lse)``; saves only ``q, k, v, out, lse``."""

    @staticmethod
    def forward(ctx, blocks, q, k, v):
        out, lse = blocks.forward(q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.blocks = blocks
        return out, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        blocks = type(ctx.blocks)(ctx.blocks.p, BACKWARD_BLOCKS)
        batch, heads, lq, lk, d, dv_ = blocks.p.sizes
        n = batch * heads
        q3, k3, v3 = q.reshape(n, lq, d), k.reshape(n, lk, d), v.reshape(n, lk, dv_)
        kt, vt, ws = k3.transpose(1, 2), v3.transpose(1, 2), Workspace(q)
        qs = q3 * blocks.factor
        blocks.bound(q, k)
        offset = blocks.offset(lse.masked_fill(torch.isneginf(lse), 0.0)).reshape(n, lq, 1)
        delta = ((dout * out).sum(-1) - dlse).reshape(n, lq, 1)
        do3 = dout.reshape(n, lq, dv_)
        dq, dk, dv = torch.zeros_like(q3), torch.zeros_like(k3), torch.zeros_like(v3)
        for n0, n1 in blocks.head_spans():
            for rs, re in blocks.row_slabs():
                do, q_rows, dq_rows = do3[n0:n1, rs:re], qs[n0:n1, rs:re], dq[n0:n1, rs:re]
                for i, (ks, ke) in enumerate(blocks.key_blocks()):
                    p, t = blocks.weights(q_rows, kt[n0:n1, :, ks:ke], n0, n1, rs, re, ks, ke,
                                          offset[n0:n1, rs:re], ws, keep_tanh=True)
                    torch.baddbmm(dv[n0:n1, ks:ke], p.transpose(1, 2), do, out=dv[n0:n1, ks:ke])
                    ds = torch.bmm(do, vt[n0:n1, :, ks:ke], out=ws.take("ds", *p.shape))
                    ds.sub_(delta[n0:n1, rs:re]).mul_(p)
                    dt = _tanh_backward(ds, t, grad_input=ds)  # dS (1 - T^2) = dT / cap
                    _accumulate(i == 0, dq_rows, dt, k3[n0:n1, ks:ke])
                    torch.baddbmm(dk[n0:n1, ks:ke], dt.transpose(1, 2), q_rows, out=dk[n0:n1, ks:ke])
        dq.mul_(blocks.cap * blocks.factor)
        dk.mul_(blocks.cap)  # dk used qs, which holds the factor already
        return None, dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)
