"""String reversal, character level."""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import ArgumentError, check_int
from .base import register
from .seq2seq import CharSeq2Seq

__all__ = ["Reversal"]


@register
@dataclass(frozen=True)
class Reversal(CharSeq2Seq):
    """Reverse a random string of letters: ``"abcd"`` -> ``"dcba"``.

    A standard toy task for attention in sequence-to-sequence models (Sutskever, Vinyals & Le
    2014, "Sequence to Sequence Learning with Neural Networks", NeurIPS, arXiv:1409.3215, note
    that reversing the source helps an RNN without attention; Bahdanau et al. 2015,
    arXiv:1409.0473, align each output with its source position). Strings are uniform letters
    from the first ``num_letters`` of ``a..z``, length uniform in ``[min_len, max_len]``.
    Batch layout as :class:`~attnkit.lab.tasks.seq2seq.CharSeq2Seq`.

    Differences from the paper: not a paper's data set; a generated stand-in.

    Shapes:
        ``inputs (n, max_len + 1)``, ``decoder_inputs (n, max_len + 2)``, ``targets (n, max_len + 2)``.

    Complexity: ``O(n max_len)`` per batch.

    Args:
        min_len, max_len: string length range.
        num_letters: alphabet size (1..26).

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("reversal", min_len=3, max_len=5)
        >>> batch = task.sample(2, generator=torch.Generator().manual_seed(0))
        >>> src, tgt = task.decode(batch["inputs"][0]), task.decode(batch["targets"][0])
        >>> src == tgt[::-1], 3 <= len(src) <= 5
        (True, True)
    """

    name: ClassVar[str] = "reversal"

    min_len: int = 4
    max_len: int = 12
    num_letters: int = 26

    def __post_init__(self):
        check_int("Reversal", "min_len", self.min_len, 1)
        check_int("Reversal", "max_len", self.max_len, self.min_len, " (= min_len)")
        check_int("Reversal", "num_letters", self.num_letters, 1)
        if self.num_letters > 26:
            raise ArgumentError(f"Reversal: num_letters must be an int in 1..26; got {self.num_letters}")

    def chars(self) -> str:
        return string.ascii_lowercase[:self.num_letters]

    @property
    def max_source_chars(self) -> int:
        return self.max_len

    @property
    def max_target_chars(self) -> int:
        return self.max_len

    def _pairs(self, n, generator):
        lengths = torch.randint(self.min_len, self.max_len + 1, (n,), generator=generator).tolist()
        letters = torch.randint(0, self.num_letters, (n, self.max_len), generator=generator).tolist()
        chars = self.chars()
        sources = ["".join(chars[c] for c in row[:k]) for row, k in zip(letters, lengths, strict=True)]
        return sources, [s[::-1] for s in sources]

    def describe(self) -> str:
        return (f"reversal: reverse strings of {self.min_len}-{self.max_len} letters from {self.num_letters}, "
                f"vocab {self.vocab_size} (seq2seq; exact match per sequence)")
