"""Long maps made smaller for a picture or a page: positions pooled into groups, labels for the groups.

A map of 512 tokens has 262,144 cells per head, more than a 2-inch panel has pixels and, over 12
layers x 12 heads, more than a web page can hold. Pooling cuts each axis into ``size`` groups of
consecutive positions, as even as possible (sizes differ by at most one), and gives each cell

    pooled[i, j] = mean over the queries q of group i of ( sum over the keys k of group j of w[q, k] )

so a pooled row still sums to what the rows it pools sum to (1 for softmax weights), and a
concentrated pattern keeps its brightness (a diagonal of 1s stays a diagonal of 1s) instead of
fading into its zero neighbours as an average would. NaN and inf stay inside their own cell.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from ...errors import ArgumentError, check_int

__all__ = ["bounds", "pool", "pooled_labels", "fit_size"]


def bounds(n: int, size: int) -> list[int]:
    """The ``min(n, size) + 1`` group boundaries of ``n`` positions cut into at most ``size`` even groups."""
    groups = min(n, size)
    return [round(g * n / groups) for g in range(groups + 1)]


def _sizes(edges: list[int]) -> list[int]:
    return [b - a for a, b in itertools.pairwise(edges)]


def _group_ids(edges: list[int]) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(edges) - 1), torch.tensor(_sizes(edges)))


def pool(w: torch.Tensor, size: int | None) -> tuple[torch.Tensor, list[int], list[int]]:
    """``(pooled (..., Lq', Lk'), query bounds, key bounds)`` of a ``(..., Lq, Lk)`` map, at most ``size`` per axis.

    ``size`` None (or at least both lengths) returns ``w`` unchanged with one position per group.
    """
    lq, lk = w.shape[-2:]
    q_edges, k_edges = bounds(lq, size or lq or 1), bounds(lk, size or lk or 1)
    if len(q_edges) - 1 == lq and len(k_edges) - 1 == lk:
        return w, q_edges, k_edges
    x = w.to(torch.float64)
    k_ids, q_ids = _group_ids(k_edges), _group_ids(q_edges)
    x = torch.zeros(*x.shape[:-1], len(k_edges) - 1, dtype=x.dtype).index_add_(-1, k_ids, x)  # sum over key groups
    x = torch.zeros(*x.shape[:-2], len(q_edges) - 1, x.shape[-1], dtype=x.dtype).index_add_(-2, q_ids, x)
    counts = torch.tensor(_sizes(q_edges), dtype=x.dtype)
    return (x / counts[:, None]).to(w.dtype if w.is_floating_point() else torch.float64), q_edges, k_edges


def pooled_labels(labels: Sequence[str] | None, edges: list[int]) -> list[str] | None:
    """One label per group: the position's label, or ``first…last`` for a group of several."""
    if labels is None:
        return None
    return [labels[a] if b - a == 1 else f"{labels[a]}…{labels[b - 1]}" for a, b in itertools.pairwise(edges)]


def fit_size(shapes: Sequence[tuple[int, int, int]], max_weights: int, who: str) -> int | None:
    """The largest ``size`` for which maps of shapes ``(H, Lq, Lk)``, pooled to ``size`` per axis, hold at most
    ``max_weights`` weights; None when they fit unpooled. ArgumentError when not even one cell per head fits."""
    check_int(who, "max_weights", max_weights, 1)
    held = lambda s: sum(h * min(lq, s) * min(lk, s) for h, lq, lk in shapes)
    longest = max((max(lq, lk) for _, lq, lk in shapes), default=0)
    if held(longest) <= max_weights:
        return None
    if held(1) > max_weights:
        raise ArgumentError(f"{who}: {sum(h for h, _, _ in shapes)} heads need at least one weight each, more than "
                            f"max_weights={max_weights:,}; pick fewer layers or heads")
    lo, hi = 1, longest  # held(lo) fits, held(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if held(mid) <= max_weights else (lo, mid)
    return lo
