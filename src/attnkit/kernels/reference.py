"""The reference kernel: the whole pipeline on dense ``(B, H, Lq, Lk)`` scores.

Readable, any dtype (float64 included), every option; it is the oracle the other
kernels are tested against and the path that returns attention weights.
Memory ``O(B H Lq Lk)``.
"""

from __future__ import annotations

from ..functional.validate import Problem
from .common import KernelOutput, block_scores, block_weights, dense_indices, dropout, upcast_inputs

NAME = "reference"


def refusal(p: Problem) -> str | None:
    """The reference honours every argument."""
    return None


def run(p: Problem) -> KernelOutput:
    q, k, v = upcast_inputs(p)
    batch, heads, lq, lk, _, _ = p.sizes
    idx = dense_indices(batch, heads, 0, lq, 0, lk, q.device)
    scores, allowed = block_scores(p, q, k, *idx)  # (B, H, Lq, Lk)
    weights, lse = block_weights(p, scores, allowed)
    out = dropout(p, weights) @ v  # (B, H, Lq, Dv)
    return KernelOutput(out, weights if p.return_weights else None, lse)
