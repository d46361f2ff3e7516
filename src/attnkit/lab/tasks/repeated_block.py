"""A language model over a repeated random block: the next token is always ``period`` tokens back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import check_int
from .base import IGNORE_INDEX, Task, register

__all__ = ["RepeatedBlock"]


@register
@dataclass(frozen=True)
class RepeatedBlock(Task):
    """Next-token prediction on a random block of ``period`` tokens repeated to ``length`` tokens.

    For Yogatama et al. 2018 ("Memory Architectures in Recurrent Neural Network Language
    Models", ICLR): a random access memory over the last ``K`` hidden states helps when the
    token needed is among them. Here ``x_t = x_{t - period}`` for ``t >= period``, so once the
    first block is read every next token is known, and it is exactly ``period`` positions back::

        b0 b1 b2 b3 b4 b5 b0 b1 b2 b3 b4 b5 b0 ...     (period 6)

    Block tokens are drawn independently from ``[1, vocab)`` (id 0 unused). ``inputs =
    x[:-1]``, ``targets = x[1:]`` scored only where the target repeats an earlier token
    (``t + 1 >= period``); the first block is unpredictable and gets -100. The state that has
    just read the needed token is ``period - 1`` steps before the one predicting it.

    Shapes:
        ``inputs (n, length - 1)``, ``targets (n, length - 1)``.

    Complexity: ``O(n length)`` per batch.

    Args:
        period: block length.
        length: sequence length (> period).
        vocab: token ids ``< vocab``.

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("repeated_block", period=3, length=7, vocab=5)
        >>> batch = task.sample(1, generator=torch.Generator().manual_seed(0))
        >>> batch["targets"][0, :2].tolist()  # the first block's tokens cannot be predicted
        [-100, -100]
        >>> bool((batch["inputs"][0, 3:] == batch["inputs"][0, :3].repeat(2)[:3]).all())
        True
    """

    name: ClassVar[str] = "repeated_block"
    kind: ClassVar[str] = "tokens"
    needs_causal_model: ClassVar[bool] = True

    period: int = 6
    length: int = 24
    vocab: int = 16

    def __post_init__(self):
        check_int("RepeatedBlock", "period", self.period, 1)
        check_int("RepeatedBlock", "length", self.length, self.period + 1, " (= period + 1)")
        check_int("RepeatedBlock", "vocab", self.vocab, 2)

    @property
    def vocab_size(self) -> int:
        return self.vocab

    @property
    def num_classes(self) -> int:
        return self.vocab

    @property
    def seq_len(self) -> int:
        return self.length - 1

    def _sample(self, n, generator):
        block = torch.randint(1, self.vocab, (n, self.period), generator=generator)
        x = block.repeat(1, -(-self.length // self.period))[:, :self.length]  # (n, length)
        targets = x[:, 1:].clone()
        targets[:, :self.period - 1] = IGNORE_INDEX
        return {"inputs": x[:, :-1], "targets": targets}

    def describe(self) -> str:
        return (f"repeated_block: a block of {self.period} random tokens repeated to {self.length}; "
                f"the next token is {self.period} back (tokens; accuracy after the first block)")
