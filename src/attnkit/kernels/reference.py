"""Path ``dense-reference``: the whole pipeline on dense ``(B, H, Lq, Lk)`` scores.

Readable, any dtype (float64 included), every option (sinks as one more term of each row's
softmax sum); the path that returns attention weights, and the one small problems take.
Memory ``O(B H Lq Lk)``.
"""

from __future__ import annotations

from ..functional.validate import Problem
from . import rules
from .path_cost import PathCost, dense_products, itemsize
from .pipeline import KernelOutput, block_scores, block_weights, dense_indices, dropout, upcast_inputs

__all__ = ["REFUSALS", "refusal", "run", "cost", "recomputed"]

REFUSALS = (rules.full_precision_kv,)  # the reference honours every other argument


def refusal(p: Problem) -> str | None:
    return None


def run(p: Problem) -> KernelOutput:
    q, k, v = upcast_inputs(p)
    batch, heads, lq, lk, _, _ = p.sizes
    idx = dense_indices(batch, heads, 0, lq, 0, lk, q.device)
    scores, allowed = block_scores(p, q, k, *idx)  # (B, H, Lq, Lk)
    weights, lse = block_weights(p, scores, allowed)
    out = dropout(p, weights) @ v  # (B, H, Lq, Dv)
    return KernelOutput(out, weights if p.return_weights else None, lse)


def cost(p: Problem, grad: bool = False) -> PathCost:
    """Both products over every pair; scores, weights and their softmax temporaries in memory."""
    b, h, lq, lk, _, _ = p.sizes
    return PathCost(b * h * lq * lk, 3.0 * b * h * lq * lk * itemsize(p), dense_products(p))


def recomputed(p: Problem, originals, replacements) -> tuple:
    """``(out, lse)`` of ``p`` here, with its tensors ``originals`` replaced (a second derivative's recomputation,
    :func:`.pipeline.twice_differentiable`); lse is None unless the normaliser is softmax."""
    swap = {id(t): r for t, r in zip(originals, replacements, strict=True)}
    q, k, v = (swap.get(id(t), t) for t in (p.q, p.k, p.v))
    bias = swap.get(id(p.bias), p.bias) if p.bias is not None else None
    sinks = swap.get(id(p.sinks), p.sinks) if p.sinks is not None else None
    result = run(p.with_inputs(q=q, k=k, v=v, bias=bias, sinks=sinks, return_lse=p.normalize == "softmax"))
    return result.out, result.lse
