"""Lag copy: at every position, the token ``lag`` positions back; a task of relative position, trained short and
tested long.

A one-layer model solves it only by attending at a fixed distance, which a position encoding of relative
distance (ALiBi, Press et al. 2022, arXiv:2108.12409; T5's bias, Raffel et al. 2020) or a learned recency
(FoX's forget gate, Lin et al. 2025, arXiv:2503.02130; PaTH, Yang et al. 2025, arXiv:2505.16381) gives
at every length, while absolute positions give it only at the positions seen in training: Press et al.
2022's test of length extrapolation (train at one length, evaluate at longer ones), in small.
``scored_from`` leaves the first positions unscored, so a test task scores only the positions beyond
the training length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import ArgumentError, check_int
from .base import IGNORE_INDEX, Task, register

__all__ = ["LagCopy", "solve"]


def solve(inputs: torch.Tensor, lag: int) -> torch.Tensor:
    """The exact answer: ``inputs`` shifted ``lag`` positions right (the first ``lag`` positions -100).

    Shapes: ``inputs (n, L)`` long -> ``(n, L)`` long.
    """
    out = torch.full_like(inputs, IGNORE_INDEX)
    out[:, lag:] = inputs[:, :-lag]
    return out


@register
@dataclass(frozen=True)
class LagCopy(Task):
    """Copy the token ``lag`` positions back, at every position from ``max(lag, scored_from)`` on.

    Token ids: ``0 .. vocab - 1``, drawn uniformly. Targets: ``inputs[:, t - lag]``; positions before
    ``max(lag, scored_from)`` are -100. Chance: ``1 / vocab``.

    Shapes: ``inputs (n, seq_len)``, ``targets (n, seq_len)``.

    Complexity: ``O(n seq_len)`` per batch.

    Args:
        seq_len: sequence length.
        vocab: number of token ids (>= 2).
        lag: the distance back (>= 1, below ``seq_len``).
        scored_from: first scored position (the training length, for a test of length extrapolation).

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("lag_copy", seq_len=6, vocab=4, lag=2)
        >>> batch = task.sample(1, generator=torch.Generator().manual_seed(0))
        >>> batch["targets"][0, 2:].tolist() == batch["inputs"][0, :4].tolist(), task.chance
        (True, 0.25)
    """

    name: ClassVar[str] = "lag_copy"
    kind: ClassVar[str] = "tokens"

    seq_len: int = 32
    vocab: int = 8
    lag: int = 2
    scored_from: int = 0

    def __post_init__(self):
        who = type(self).__name__
        check_int(who, "seq_len", self.seq_len, 2)
        check_int(who, "vocab", self.vocab, 2)
        check_int(who, "lag", self.lag, 1)
        check_int(who, "scored_from", self.scored_from, 0)
        if self.lag >= self.seq_len or self.scored_from >= self.seq_len:
            raise ArgumentError(f"{who}: lag and scored_from must be below seq_len ({self.seq_len}); got lag "
                                f"{self.lag}, scored_from {self.scored_from}")

    @property
    def vocab_size(self) -> int:
        return self.vocab

    @property
    def num_classes(self) -> int:
        return self.vocab

    @property
    def chance(self) -> float:
        """The accuracy of a uniform guess."""
        return 1.0 / self.vocab

    def _sample(self, n, generator):
        inputs = torch.randint(0, self.vocab, (n, self.seq_len), generator=generator)
        targets = solve(inputs, self.lag)
        targets[:, :self.scored_from] = IGNORE_INDEX
        return {"inputs": inputs, "targets": targets}

    def describe(self) -> str:
        return (f"lag_copy: the token {self.lag} back at each of {self.seq_len} positions, vocab {self.vocab}, scored "
                f"from position {max(self.lag, self.scored_from)} (tokens; accuracy, chance {100 / self.vocab:.1f} %)")
