"""Backward of :mod:`.bias_slabs`: torch's fused backward per slab, or FlashAttention-2 in plain torch.

A constant bias (no parameter needs its gradient) rebuilds each slab's bias and
runs torch's fused CPU backward with the saved output and log-sum-exp. A bias
with learned parameters (a relative-position table or a tensor bias that
requires grad) needs ``dL/dS``, which the fused backward does not return, so it
runs Dao 2023 (arXiv:2307.08691, Alg. 2) one slab of rows at a time::

    S = scale * Q K^T + bias;  P = exp(S - lse)
    dV += P^T dO;  dP = dO V^T;  dS = P * (dP - rowsum(dO * O))
    dQ = scale * dS K;  dK += scale * dS^T Q;  d(bias) = dS

``d(bias)`` reaches the parameters through autograd on the slab's bias, rebuilt
with gradients enabled. A masked pair has bias ``-inf``, so ``P = dS = 0`` there;
a row with no allowed key has ``lse = 0`` from the fused kernel and ``P = 0``.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..functional import sinks
from .rules import FLASH_BACKWARD

__all__ = ["SlabAttention"]

class SlabAttention(torch.autograd.Function):
    """``plan.forward`` saving only ``q, k, v, out, lse``; ``apply(plan, q, k, v, sinks, *learned)``.

    With sinks (or None), the output and lse are joined with them and both backwards run from the joined
    pair, which rebuilds the sink call's probabilities (:mod:`attnkit.functional.sinks`).
    """

    @staticmethod
    def forward(ctx, plan, q, k, v, sink_logits, *params):
        k, v = plan.keys(k, v)
        out, lse = plan.forward(q, k, v)
        if sink_logits is not None:
            out, lse = sinks.joined(out, lse, sink_logits)
        ctx.save_for_backward(q, k, v, out, lse, sink_logits)
        ctx.plan, ctx.params = plan, params
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse, sink_logits = ctx.saved_tensors
        plan, dout = ctx.plan, dout.contiguous()
        if any(ctx.needs_input_grad[5:]):
            dq, dk, dv, dparams = _learned_backward(plan, q, k, v, out, lse, dout, ctx.params)
        else:
            dq, dk, dv = _fused_backward(plan, q, k, v, out, lse, dout)
            dparams = [None] * len(ctx.params)
        if plan.reversed:
            dk, dv = dk.flip(2), dv.flip(2)
        dsinks = sinks.kernel_gradient(dout, out, lse, sink_logits) if ctx.needs_input_grad[4] else None
        return None, dq, dk, dv, dsinks, *dparams


def _fused_backward(plan, q, k, v, out, lse, dout):
    dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for s, e in plan.slabs:
        gq, gk, gv = FLASH_BACKWARD(dout[:, :, s:e], q[:, :, s:e], k, v, out[:, :, s:e], lse[:, :, s:e], 0.0,
                                    False, attn_mask=plan.bias(s, e), scale=plan.scale)
        dq[:, :, s:e] = gq
        dk += gk
        dv += gv
    return dq, dk, dv


def _reduce_to(grad: torch.Tensor, shape) -> torch.Tensor:
    """Sum ``grad`` over the dims where ``shape`` has size 1 (the bias broadcast there)."""
    dims = [d for d, (g, s) in enumerate(zip(grad.shape, shape, strict=True)) if s == 1 and g != 1]
    return grad.sum(dims, keepdim=True) if dims else grad


def _learned_backward(plan, q, k, v, out, lse, dout, params):
    dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dparams = [None] * len(params)
    wanted = [i for i, t in enumerate(params) if t.requires_grad]
    kt, vt, scale = k.transpose(-1, -2), v.transpose(-1, -2), plan.scale
    for s, e in plan.slabs:
        with torch.enable_grad():
            bias = plan.bias(s, e)  # (B|1, H|1, rows|1, Lk), graph to the parameters
        qs, do = q[:, :, s:e], dout[:, :, s:e]
        p = torch.exp(((qs * scale) @ kt).add_(bias.detach()).sub_(lse[:, :, s:e, None]))  # (B, H, rows, Lk)
        dv += p.transpose(-1, -2) @ do
        ds = (do @ vt).sub_((do * out[:, :, s:e]).sum(-1, keepdim=True)).mul_(p)
        dq[:, :, s:e] = (ds @ k).mul_(scale)
        dk += (ds.transpose(-1, -2) @ qs).mul_(scale)
        if bias.requires_grad:
            grads = torch.autograd.grad(bias, [params[i] for i in wanted], _reduce_to(ds, bias.shape),
                                        allow_unused=True)
            for i, g in zip(wanted, grads, strict=True):
                if g is not None:
                    dparams[i] = g if dparams[i] is None else dparams[i] + g
    return dq, dk, dv, dparams
