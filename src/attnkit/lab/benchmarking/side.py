"""One side of a benchmark comparison: a :class:`Method`, or :class:`Unavailable` with the reason it cannot run.

A :class:`Method` is a zero-argument forward callable plus the leaf tensors its
backward fills, so that timing, the correctness check and the memory child all run
exactly the same code. The sides themselves are built in :mod:`.methods`, :mod:`.flex`
and :mod:`.additive`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

__all__ = ["Method", "Unavailable"]


class Unavailable(Exception):
    """A comparison that cannot run here; the message is shown as ``n/a: <message>``."""


class Method(NamedTuple):
    name: str
    fn: Callable[[], torch.Tensor]
    leaves: tuple[torch.Tensor, ...]
    notes: dict | None = None  # e.g. compile seconds, shown next to the row
    same: bool = True  # computes the same function as attnkit's side (False: a throughput reference only)
