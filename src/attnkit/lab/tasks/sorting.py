"""Sorting as a pointer task."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import ArgumentError, check_int
from .base import Task, register

__all__ = ["Sorting"]


@register
@dataclass(frozen=True)
class Sorting(Task):
    """Sort numbers by pointing: output the input indices in ascending order of value.

    Vinyals, Fortunato & Jaitly 2015, "Pointer Networks", NeurIPS, arXiv:1506.03134, Sec. 4
    (sorting as an extra experiment, after Vinyals et al. 2016 "Order Matters",
    arXiv:1511.06391): ``targets[i]`` is the permutation ``C`` with
    ``x[C_1] < x[C_2] < ... < x[C_N]``.

    Points are uniform in ``[0, 1)``; with ``point_dim = 2`` each point has two coordinates
    and only the first is sorted on (the second is a distractor). Ties (probability ~0 in
    float32) are broken by the lower index. The output length is always ``num_points``,
    so there is no end-of-sequence pointer and no -100.

    Differences from the paper: none.

    Shapes:
        ``inputs (n, num_points, point_dim)`` float32, ``targets (n, num_points)`` long.

    Complexity: ``O(n N log N)`` per batch.

    Args:
        num_points: numbers per example (N).
        point_dim: 1, or 2 with the first coordinate sorted on.

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("sorting", num_points=4)
        >>> batch = task.sample(2, generator=torch.Generator().manual_seed(0))
        >>> x, order = batch["inputs"][0, :, 0], batch["targets"][0]
        >>> bool((x[order].diff() > 0).all()), task.accuracy(order.flip(0).expand(2, 4), batch) < 1
        (True, True)
    """

    name: ClassVar[str] = "sorting"
    kind: ClassVar[str] = "pointer"

    num_points: int = 8
    point_dim: int = 1

    def __post_init__(self):
        check_int("Sorting", "num_points", self.num_points, 1)
        if self.point_dim not in (1, 2) or isinstance(self.point_dim, bool):
            raise ArgumentError(f"Sorting: point_dim must be 1 or 2; got {self.point_dim!r}")

    @property
    def num_classes(self) -> int:
        """Pointer slots: one per input point."""
        return self.num_points

    def _sample(self, n, generator):
        points = torch.rand(n, self.num_points, self.point_dim, generator=generator)
        targets = points[..., 0].argsort(dim=-1, stable=True)  # (n, N) indices, ascending values
        return {"inputs": points, "targets": targets}

    def describe(self) -> str:
        return (f"sorting: sort {self.num_points} uniform numbers by pointing (point dim {self.point_dim}) "
                f"(pointer; exact match per sequence)")
