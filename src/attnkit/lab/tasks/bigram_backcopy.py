"""Bigram-Backcopy: a bigram chain whose trigger tokens are followed by a copy of the token before them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import check_int
from .base import IGNORE_INDEX, Task, register

__all__ = ["BigramBackcopy"]


@register
@dataclass(frozen=True)
class BigramBackcopy(Task):
    """Guo et al. 2024's Bigram-Backcopy task: a bigram chain whose trigger tokens are followed by a copy.

    Guo et al. 2024, "Active-Dormant Attention Heads: Mechanistically Demystifying Extreme-Token
    Phenomena in LLMs", arXiv:2410.13835, Sec. 2: a one-layer Transformer's head is needed only
    after a trigger and is "dormant" elsewhere, where it puts its attention on BOS (an attention
    sink).

    ``x_0 = BOS``; after a trigger ``x_{t+1} = x_{t-1}`` (back-copy), otherwise ``x_{t+1}`` is one of
    three successors of ``x_t`` fixed by ``table_seed``, uniformly. ``inputs = x_0 .. x_{L-1}``;
    ``next`` holds every next token (the language-model loss), ``targets`` only those after a trigger
    (the metric: the deterministic, attention-dependent positions).

    Differences from the paper: three successors a token (the paper draws a bigram distribution
    from data); the copy is scored alone.

    Shapes: ``inputs``, ``targets``, ``next`` ``(n, length)`` long.

    Args:
        vocab_size: tokens, BOS (0) included.
        triggers: the last ``triggers`` ids are triggers.
        length: ``L``.
        table_seed: seeds the successor table.

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("bigram_backcopy", vocab_size=11, triggers=2, length=13)
        >>> batch = task.sample(4, generator=torch.Generator().manual_seed(0))
        >>> batch["inputs"].shape, int(batch["inputs"][0, 0])  # BOS first
        (torch.Size([4, 13]), 0)
    """

    name: ClassVar[str] = "bigram_backcopy"
    kind: ClassVar[str] = "tokens"
    needs_causal_model: ClassVar[bool] = True

    vocab_size: int = 24
    triggers: int = 3
    length: int = 32
    table_seed: int = 123

    def __post_init__(self):
        check_int("BigramBackcopy", "triggers", self.triggers, 1)
        check_int("BigramBackcopy", "vocab_size", self.vocab_size, self.triggers + 2)
        check_int("BigramBackcopy", "length", self.length, 2)

    @property
    def num_classes(self) -> int:
        return self.vocab_size

    @property
    def seq_len(self) -> int:
        return self.length

    def is_trigger(self, ids: torch.Tensor) -> torch.Tensor:
        return ids >= self.vocab_size - self.triggers

    def _sample(self, n, generator):
        table = torch.randint(1, self.vocab_size, (self.vocab_size, 3),
                              generator=torch.Generator().manual_seed(self.table_seed))
        x = torch.zeros(n, self.length + 1, dtype=torch.long)
        x[:, 1] = torch.randint(1, self.vocab_size - self.triggers, (n,), generator=generator)
        for t in range(1, self.length):
            successor = table[x[:, t], torch.randint(0, 3, (n,), generator=generator)]
            x[:, t + 1] = torch.where(self.is_trigger(x[:, t]), x[:, t - 1], successor)
        inputs, following = x[:, :-1], x[:, 1:]
        targets = torch.where(self.is_trigger(inputs), following, torch.full_like(following, IGNORE_INDEX))
        return {"inputs": inputs, "targets": targets, "next": following}

    def describe(self) -> str:
        return (f"bigram_backcopy: {self.vocab_size} tokens, {self.triggers} triggers, length {self.length} "
                "(tokens; accuracy after triggers)")


