"""Backward of :mod:`.softcap_loop`: FlashAttention-2's backward through ``cap * tanh``.

Dao 2023 (arXiv:2307.08691, Alg. 2), per block of rows and keys, from the saved
``lse`` (which includes the fixed shift)::

    T = tanh(q' K^T);  P = exp(cap * T - lse)          (q' = q * scale / cap)
    dV += P^T dO;  dS = P * (dO V^T - D + dlse),  D = rowsum(dO * O)
    dT = dS * cap * (1 - T^2);  dQ = dT K * scale / cap;  dK += dT^T Q * scale / cap

``T`` and ``P`` are computed as in the forward (the Pade ``tanh`` where it
applies, one fused multiply-add and ``exp2``); ``dS (1 - T^2)`` is one pass
(``aten.tanh_backward``, in place); the block temporaries live in one workspace;
``cap`` is applied to ``dQ`` and ``dK`` once at the end. (Accumulating with
``baddbmm_`` was about 1.5% faster but hides three matmuls from FlopCounterMode,
which tests/costing/test_analytic.py relies on.) ``dlse`` is the gradient reaching the returned
log-sum-exp (``d lse / d s = P``). Masked pairs have ``P = 0``; a row with no
allowed key has ``lse = -inf``, which is replaced by 0 before the subtraction
(all its ``P`` are masked to 0 anyway).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from .pipeline import Workspace

__all__ = ["SoftcapAttention"]

BACKWARD_BLOCKS = (128, 1 << 18)  # (query rows, score elements) per block; softcap_loop.FORWARD_BLOCKS says why

_tanh_backward = torch.ops.aten.tanh_backward.grad_input  # grad * (1 - t^2), one pass


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
        kt, vt, ws = k.transpose(-1, -2), v.transpose(-1, -2), Workspace(q)
        qs = q * blocks.factor
        blocks.bound(q, k)
        offset = blocks.offset(lse.masked_fill(torch.isneginf(lse), 0.0))[..., None]  # (B, H, Lq, 1)
        delta = ((dout * out).sum(-1) - dlse)[..., None]  # (B, H, Lq, 1)
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for rs, re in blocks.row_slabs():
            do, dq_rows = dout[:, :, rs:re], None
            for ks, ke in blocks.key_blocks():
                p, t = blocks.weights(qs[:, :, rs:re], kt, rs, re, ks, ke, offset[:, :, rs:re], ws, keep_tanh=True)
                dv[:, :, ks:ke] += p.transpose(-1, -2) @ do
                ds = torch.matmul(do, vt[..., ks:ke], out=ws.take("ds", *p.shape)).sub_(delta[:, :, rs:re]).mul_(p)
                dt = _tanh_backward(ds, t, grad_input=ds)  # dS (1 - T^2) = dT / cap
                part = dt @ k[:, :, ks:ke]
                dq_rows = part if dq_rows is None else dq_rows.add_(part)
                dk[:, :, ks:ke] += dt.transpose(-1, -2) @ qs[:, :, rs:re]
            dq[:, :, rs:re] = dq_rows * (blocks.cap * blocks.factor)
        return None, dq, dk.mul_(blocks.cap), dv  # dk used qs, which holds the factor already
