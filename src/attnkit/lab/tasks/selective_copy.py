"""Selective copying."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import check_int
from .base import IGNORE_INDEX, Task, register

__all__ = ["SelectiveCopy"]


@register
@dataclass(frozen=True)
class SelectiveCopy(Task):
    """Selective copying: reproduce the data tokens scattered among noise, in order.

    Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces",
    arXiv:2312.00752, Sec. 3.1 (Fig. 2, "Selective Copying"). Layout of one example::

        N d1 N N d2 N ... N d3 N   M M M
        \\____ context_len ______/  \\num_tokens/

    ``num_tokens`` data tokens sit at random (sorted) positions of the first
    ``context_len`` positions, the rest is the noise token ``N``; then ``num_tokens``
    marker tokens ``M``. ``targets`` holds the data tokens in order of appearance at the
    marker positions and -100 elsewhere.

    Token ids: 0 = noise, 1 = marker, data ``2 .. 2 + data_vocab - 1`` (drawn with
    replacement). Targets use the same ids (``num_classes = vocab_size``).

    Differences from the paper: none in the task; sizes are small by default (the paper
    uses 16 data tokens from a vocabulary of 16 in a sequence of 4096).

    Shapes:
        ``inputs (n, seq_len)``, ``targets (n, seq_len)``, ``seq_len = context_len + num_tokens``.

    Complexity: ``O(n context_len log context_len)`` per batch (a sort), vectorised.

    Args:
        num_tokens: data tokens to copy.
        context_len: positions holding data and noise (>= num_tokens).
        data_vocab: number of distinct data tokens.

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("selective_copy", num_tokens=2, context_len=5, data_vocab=3)
        >>> batch = task.sample(1, generator=torch.Generator().manual_seed(0))
        >>> batch["inputs"].shape, task.vocab_size, task.accuracy(batch["targets"], batch)
        (torch.Size([1, 7]), 5, 1.0)
    """

    name: ClassVar[str] = "selective_copy"
    kind: ClassVar[str] = "tokens"

    num_tokens: int = 4
    context_len: int = 16
    data_vocab: int = 8

    def __post_init__(self):
        check_int("SelectiveCopy", "num_tokens", self.num_tokens, 1)
        check_int("SelectiveCopy", "context_len", self.context_len, self.num_tokens, " (= num_tokens)")
        check_int("SelectiveCopy", "data_vocab", self.data_vocab, 1)

    @property
    def vocab_size(self) -> int:
        return 2 + self.data_vocab

    @property
    def num_classes(self) -> int:
        return self.vocab_size

    @property
    def seq_len(self) -> int:
        return self.context_len + self.num_tokens

    def _sample(self, n, generator):
        t, c = self.num_tokens, self.context_len
        positions = torch.rand(n, c, generator=generator).argsort(-1)[:, :t].sort(-1).values  # (n, T) increasing
        data = torch.randint(2, 2 + self.data_vocab, (n, t), generator=generator)
        context = torch.zeros(n, c, dtype=torch.long).scatter(1, positions, data)  # (n, context_len)
        inputs = torch.cat([context, torch.ones(n, t, dtype=torch.long)], dim=1)  # (n, seq_len)
        targets = torch.full_like(inputs, IGNORE_INDEX)
        targets[:, c:] = data
        return {"inputs": inputs, "targets": targets}

    def describe(self) -> str:
        return (f"selective_copy: copy {self.num_tokens} of {self.data_vocab} data tokens scattered in "
                f"{self.context_len} positions, length {self.seq_len} (tokens; marker accuracy)")
