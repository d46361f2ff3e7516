"""The correctness check and the verdict of a benchmark row: do both sides compute the same function?"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..analysis.timing import with_backward
from .side import Method

__all__ = ["tolerance", "verdict", "timed_call", "outputs_and_grads", "max_diff"]


def tolerance(dtype: str) -> float:
    """Allowed max |diff| relative to ``max(1, max |reference|)``: far above rounding, far below a wrong result."""
    return {"float64": 1e-8, "float32": 1e-3, "bfloat16": 6e-2, "float16": 1e-2}[dtype]


def verdict(ratio, goal, diff_ok, mem_ratio=None, mem_goal=None) -> str:
    """PASS / MISS against the goals; WRONG when the outputs differ; "—" without a goal; n/a without a ratio."""
    if ratio is None:
        return "n/a"
    if diff_ok is False:
        return "WRONG"
    if goal is None and mem_goal is None:
        return "—"
    fast = goal is None or ratio <= goal
    small = mem_goal is None or (mem_ratio is not None and mem_ratio <= mem_goal)
    return "PASS" if fast and small else "MISS"


def timed_call(m: Method, backward: bool) -> Callable[[], object]:
    return with_backward(m.fn, m.leaves) if backward else m.fn


def outputs_and_grads(m: Method, backward: bool) -> list[torch.Tensor]:
    """Output, and for a backward pass the gradient of every leaf, as float32."""
    with torch.set_grad_enabled(backward):
        out = timed_call(m, backward)()
    grads = [t.grad for t in m.leaves] if backward else []
    return [out.detach().float()] + [g.float() if g is not None else torch.zeros(()) for g in grads]


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> tuple[float, float]:
    """``(max |a - b|, max |b|)`` over every tensor pair."""
    diff = max((x - y).abs().max().item() if x.numel() else 0.0 for x, y in zip(a, b, strict=True))
    scale = max(y.abs().max().item() if y.numel() else 0.0 for y in b)
    return diff, scale
