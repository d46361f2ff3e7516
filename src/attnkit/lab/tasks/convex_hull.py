"""Planar convex hull as a pointer task."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import ShapeError, check_int
from .base import IGNORE_INDEX, Task, register

__all__ = ["ConvexHull", "convex_hull"]


def _cross(o, a, b) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def convex_hull(points) -> list[int]:
    """Indices of the hull vertices of 2-D ``points``, counter-clockwise, starting at the lowest index.

    Andrew's monotone chain (1979). Points on a hull edge that are not corners (collinear)
    are left out; a point given several times is one vertex, named by its lowest index (so
    identical points give one index, collinear ones their two ends). ``points`` is an ``(N, 2)``
    tensor or a sequence of ``(x, y)`` pairs.
    """
    pts = points.tolist() if isinstance(points, torch.Tensor) else [list(p) for p in points]
    if any(len(p) != 2 for p in pts):
        lengths = sorted({len(p) for p in pts})
        raise ShapeError(f"convex_hull: points must have shape (N, 2); got rows of lengths {lengths}")
    order = sorted(range(len(pts)), key=lambda i: (pts[i][0], pts[i][1], i))
    # a repeated point is one vertex: keep its lowest index (first in the sort), else a corner could appear twice
    order = [i for k, i in enumerate(order) if k == 0 or pts[i] != pts[order[k - 1]]]
    if len(order) < 3:
        hull = order
    else:
        lower: list[int] = []
        upper: list[int] = []
        for chain, seq in ((lower, order), (upper, order[::-1])):
            for i in seq:
                # pop while the last turn is clockwise or straight: keeps strict left turns only
                while len(chain) >= 2 and _cross(pts[chain[-2]], pts[chain[-1]], pts[i]) <= 0:
                    chain.pop()
                chain.append(i)
        hull = lower[:-1] + upper[:-1]  # (each chain's last point starts the other chain)
    if not hull:
        return []
    start = hull.index(min(hull))
    return hull[start:] + hull[:start]


@register
@dataclass(frozen=True)
class ConvexHull(Task):
    """Point at the convex hull of planar points, counter-clockwise.

    Vinyals, Fortunato & Jaitly 2015, "Pointer Networks", NeurIPS, arXiv:1506.03134, Sec. 4.2:
    points uniform in the unit square; the output is the sequence of hull vertex indices,
    counter-clockwise, starting from the lowest index, then an end-of-sequence pointer.

    End of sequence: index ``num_points`` (= ``end_index``), i.e. a model points at one extra
    learned "end" slot appended after the ``num_points`` inputs; then -100 up to length
    ``num_points + 1``. Collinear points on a hull edge are not vertices.

    Differences from the paper: the paper's end symbol is a special input at position 0 (so
    its point indices start at 1); here points keep indices ``0 .. N-1`` and the end slot is
    ``N``. Hull computed with Andrew's monotone chain (exact in float64 on the float32 points).

    Shapes:
        ``inputs (n, N, 2)`` float32, ``targets (n, N + 1)`` long, ``hull_sizes (n,)``.

    Complexity: ``O(n N log N)`` per batch (Python, per example).

    Args:
        num_points: points per example (N >= 3).

    Example:
        >>> from attnkit.lab.tasks.convex_hull import convex_hull
        >>> convex_hull([(1, 1), (0, 0), (0.5, 0.5), (1, 0), (0, 1), (0.5, 0)])
        [0, 4, 1, 3]
    """

    name: ClassVar[str] = "convex_hull"
    kind: ClassVar[str] = "pointer"

    num_points: int = 10

    def __post_init__(self):
        check_int("ConvexHull", "num_points", self.num_points, 3)

    @property
    def end_index(self) -> int:
        return self.num_points

    @property
    def num_classes(self) -> int:
        """Pointer slots: the points plus the end slot."""
        return self.num_points + 1

    def _sample(self, n, generator):
        points = torch.rand(n, self.num_points, 2, generator=generator)
        targets = torch.full((n, self.num_points + 1), IGNORE_INDEX, dtype=torch.long)
        sizes = []
        for i, example in enumerate(points.double().tolist()):
            hull = convex_hull(example)
            targets[i, :len(hull) + 1] = torch.tensor([*hull, self.end_index])
            sizes.append(len(hull))
        return {"inputs": points, "targets": targets, "hull_sizes": torch.tensor(sizes)}

    def describe(self) -> str:
        return (f"convex_hull: hull of {self.num_points} uniform points, CCW from the lowest index, end = "
                f"{self.end_index} (pointer; exact match per sequence)")
