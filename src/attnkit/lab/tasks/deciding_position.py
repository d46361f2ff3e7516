"""One deciding position: the label is the value of the single marked token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import check_int
from .base import Task, register

__all__ = ["DecidingPosition"]


@register
@dataclass(frozen=True)
class DecidingPosition(Task):
    """Classify a sequence by its one marked token: exactly one position decides the label.

    For Xu et al. 2015 ("Show, Attend and Tell", arXiv:1502.03044, Sec. 4): hard attention
    picks one location per step; here one location holds all the evidence, so a model that
    attends to the right single position solves the task and the average of a soft
    attention gains nothing. One example::

        v3 v1 v7 *v2 v5 v0 ...     label 2

    ``length`` tokens, each an unmarked value ``v in [0, num_values)`` (id ``1 + v``) except
    one uniform position holding a marked value (id ``1 + num_values + v``). The label is the
    marked value; the unmarked values are drawn independently, so they say nothing about it.
    ``deciding_position`` is the marked index. Id 0 is unused (padding).

    Differences from the paper: a sequence of symbols stands in for image regions.

    Shapes:
        ``inputs (n, length)``, ``targets (n,)``, ``deciding_position (n,)``.

    Complexity: ``O(n length)`` per batch.

    Args:
        length: positions per sequence.
        num_values: values (and classes).

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("deciding_position", length=5, num_values=3)
        >>> batch = task.sample(2, generator=torch.Generator().manual_seed(0))
        >>> rows = torch.arange(2)
        >>> bool((batch["inputs"][rows, batch["deciding_position"]] == 4 + batch["targets"]).all())
        True
    """

    name: ClassVar[str] = "deciding_position"
    kind: ClassVar[str] = "classify"

    length: int = 16
    num_values: int = 8

    def __post_init__(self):
        check_int("DecidingPosition", "length", self.length, 1)
        check_int("DecidingPosition", "num_values", self.num_values, 2)

    @property
    def vocab_size(self) -> int:
        return 1 + 2 * self.num_values

    @property
    def num_classes(self) -> int:
        return self.num_values

    def _sample(self, n, generator):
        inputs = torch.randint(1, 1 + self.num_values, (n, self.length), generator=generator)
        position = torch.randint(0, self.length, (n,), generator=generator)
        label = torch.randint(0, self.num_values, (n,), generator=generator)
        inputs[torch.arange(n), position] = 1 + self.num_values + label
        return {"inputs": inputs, "targets": label, "deciding_position": position}

    def describe(self) -> str:
        return (f"deciding_position: {self.length} tokens, one marked; the label is its value "
                f"({self.num_values} classes)")
