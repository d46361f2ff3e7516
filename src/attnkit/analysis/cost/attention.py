"""The cost of one :func:`attnkit.attention` call, following the execution path the dispatcher picks.

:func:`attend` asks :func:`attnkit.explain` which path ``backend="auto"`` (or a
forced backend) runs, on stand-in tensors of the right shapes (one element each,
expanded), and records that path's own cost formula (``cost(p, grad)`` beside its
code in :mod:`attnkit.kernels`, one formula per path; see
:mod:`attnkit.kernels.path_cost`): products that autograd differentiates (the
backward costs once per operand needing a gradient, once more when a slab is
checkpointed), or a fused kernel's forward and backward formulas.

Elementwise work (scaling, masking, softmax at ~5 operations per score) goes to
``other_flops``; the path's workspace is the peak memory beyond q, k, v and the output.
"""

from __future__ import annotations

import torch

from ...core import explain
from .tally import Tally, zeros

__all__ = ["attend"]

_SOFTMAX_OPS = 5  # max, subtract, exp, sum, divide per score entry


def attend(t: Tally, label: str, b: int, h: int, lq: int, lk: int, d: int, dv: int, *, hkv: int | None = None,
           grads: tuple[bool, bool, bool] = (True, True, True), weights_grad: bool = False,
           pairwise: bool = True, dtype: torch.dtype = torch.float32, **kwargs) -> str:
    """Record one ``attention(q, k, v, **kwargs)`` with q ``(b, h, lq, d)``, k/v ``(b, hkv, lk, d|dv)``.

    Args:
        label: prefix of the term names ("" for a lone call).
        grads: which of q, k, v need a gradient (for the backward count).
        weights_grad: the weights need a gradient besides through q and k (a bias that needs one).
        pairwise: the score is ``q k^T`` ("dot", "scaled_dot", "cosine"); False for a score function
            whose own products the caller counts.
        kwargs: the attention() keyword arguments (mask, bias, score, normalize, ...); a bias tensor
            may be a stand-in of the right shape.

    Returns:
        The backend that runs.
    """
    hkv = h if hkv is None else hkv
    gq, gk, gv = grads
    grad = t.backward and (gq or gk or gv)  # kernels plan differently under autograd: decide as the run does
    with torch.enable_grad() if grad else torch.no_grad():
        q, k, v = (zeros(dtype, *shape, requires_grad=grad) for shape in
                   ((b, h, lq, d), (b, hkv, lk, d), (b, hkv, lk, dv)))
        decision = explain(q, k, v, **kwargs)
        backend = decision.backend
        t.io(q.numel() + k.numel() + v.numel() + b * h * lq * dv)
        if 0 in (b, h, lq, lk):
            return backend
        grads = (gq or gk or gv, int(gq) + int(gk), int(gq or gk or weights_grad) + int(gv))
        computed = _kernel(t, label, decision.cost, grads, pairwise)
    t.transient(decision.peak_bytes)
    t.ew(f"{label}softmax and mask", computed, _SOFTMAX_OPS + (kwargs.get("mask") is not None))
    t.ew(f"{label}scale", b * h * lq * d)
    t.inter(b * h * lq * dv)
    return backend


def _kernel(t: Tally, label: str, cost, grads, pairwise: bool) -> int:
    """Record a path's :class:`~attnkit.kernels.path_cost.PathCost`; returns the number of score entries computed.

    ``grads``: (any gradient, operands of the score product needing one, of the output product).
    """
    grad, s_grads, o_grads = grads
    for pr in cost.products:
        if pr.operands == "scores" and not pairwise:
            continue  # a score function whose own products the caller counts
        t.mm(f"{label}{pr.label}", pr.batch, pr.m, pr.k, pr.n,
             grads=s_grads if pr.operands == "scores" else o_grads, recompute=pr.recompute)
    if cost.fused is not None:
        name, forward, backward = cost.fused
        t.fused(f"{label}{name}", forward, backward, grad=grad)
    if cost.materialized:
        t.inter(cost.scores, cost.scores, keep=False)
    return cost.scores
