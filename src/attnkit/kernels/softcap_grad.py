"""Backward of :mod:`.softcap_loop`: FlashAttention-2's backward through ``cap * tanh``.

Dao 2023 (arXiv:2307.08691, Alg. 2), per block of rows and keys, from the saved
``lse`` (which includes the fixed shift)::

    T = tanh(q' K^T);  P = exp(cap * T - lse)          (q' = q * scale / cap)
    dV += P^T dO;  dS = P * (dO V^T - D + dlse),  D = rowsum(dO * O)
    dT = dS * cap * (1 - T^2);  dQ = dT K * scale / cap;  dK += dT^T Q * scale / cap

``dlse`` is the gradient reaching the returned log-sum-exp (``d lse / d s = P``).
Masked pairs have ``P = 0``; a row with no allowed key has ``lse = -inf``, which
is replaced by 0 before the subtraction (all its ``P`` are masked to 0 anyway).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

__all__ = ["SoftcapAttention"]

BACKWARD_BLOCKS = (128, 1 << 19)  # (query rows, score elements) per block: five matmuls and tanh stay in cache


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
        factor = blocks.p.scale / blocks.cap
        kt, vt = k.transpose(-1, -2), v.transpose(-1, -2)
        qs = q * factor
        lse = lse.masked_fill(torch.isneginf(lse), 0.0) - blocks.c  # the shift is applied by weights()
        delta = (dout * out).sum(-1) - dlse  # (B, H, Lq)
        dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for rs, re in blocks.row_slabs():
            do, dq_rows = dout[:, :, rs:re], None
            for ks, ke in blocks.key_blocks():
                p, t = blocks.weights(qs[:, :, rs:re], kt, rs, re, ks, ke, lse[:, :, rs:re])
                dv[:, :, ks:ke] += p.transpose(-1, -2) @ do
                ds = (do @ vt[..., ks:ke]).sub_(delta[:, :, rs:re, None]).mul_(p)
                dt = ds.mul_(t.square_().sub_(1.0).mul_(-blocks.cap))  # dS * cap * (1 - T^2)
                part = dt @ k[:, :, ks:ke]
                dq_rows = part if dq_rows is None else dq_rows.add_(part)
                dk[:, :, ks:ke] += dt.transpose(-1, -2) @ qs[:, :, rs:re]
            dq[:, :, rs:re] = dq_rows * factor
        return None, dq, dk, dv  # dk used qs, which holds the factor already
