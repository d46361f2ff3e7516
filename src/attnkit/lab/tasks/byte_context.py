"""Byte-level documents whose marks mean what the document's header says: read every mark in its context."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import ArgumentError, check_int
from .base import IGNORE_INDEX, Task, register
from .byte_docs import VOCAB_SIZE, decode, encode, random_words

__all__ = ["ByteContext", "PLAIN", "NEGATED"]

PLAIN, NEGATED = encode("=")[0], encode("~")[0]
_PLUS, _MINUS = encode("+")[0], encode("-")[0]


@register
@dataclass(frozen=True)
class ByteContext(Task):
    """Label every ``+`` / ``-`` mark of a byte document by its stance, which the document's header decides.

    For Long Range Arena's byte-level text classification (Tay et al. 2021, arXiv:2011.04006,
    Sec. 3.2: documents read byte by byte, where a word's meaning can rest on text far away); the
    documents here are generated. The first ``length / header_fraction`` bytes are the header, all
    ``=`` (a plain document) or all ``~`` (a negated one); the rest is lowercase words with
    ``marks`` marks at random places::

        "================ kd ez+ ka u wp- ... xo + ab" (plain)        stances 1, 0, 1
        "~~~~~~~~~~~~~~~~ kd ez+ ka u wp- ... xo + ab" (negated)      stances 0, 1, 0

    The target at a mark is its stance: 1 for ``+`` in a plain document or ``-`` in a negated one,
    else 0; -100 elsewhere. Marks and headers are drawn uniformly, so both stances are equally likely.

    What it tests: reading each token in the context of the whole document (the header is a
    global token, repeated). Why it needs long range: a mark is on average ``length / 2`` bytes
    from the header, and the mark alone says nothing (its stance is the mark XOR the header).
    Token counts do not decide it: they show the header and the mark, but the stance is their
    exclusive or, which no weighted sum of counts can give; the last bytes miss the header.

    Token ids: 0 = padding (unused), byte ``b`` -> ``b + 1`` (``tasks.byte_docs``).

    Shapes:
        ``inputs (n, length)`` long; ``targets (n, length)`` long, the stance at each mark and -100
        elsewhere; ``negated (n,)`` bool.

    Complexity: ``O(n length log length)`` per batch (a sort for the mark places), vectorised.

    Args:
        length: bytes per document.
        marks: marks per document (>= 1; they fit after the header).
        header_fraction: the header is ``length // header_fraction`` bytes (>= 1 byte).

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("byte_context", length=64, marks=4)
        >>> batch = task.sample(1, generator=torch.Generator().manual_seed(0))
        >>> text = task.decode(batch["inputs"][0])
        >>> text[:8] in ("=" * 8, "~" * 8), sum(text.count(m) for m in "+-"), batch["targets"].ne(-100).sum().item()
        (True, 4, 4)
    """

    name: ClassVar[str] = "byte_context"
    kind: ClassVar[str] = "tokens"
    vocab_size: ClassVar[int] = VOCAB_SIZE

    length: int = 1024
    marks: int = 64
    header_fraction: int = 8

    def __post_init__(self):
        check_int("ByteContext", "marks", self.marks, 1)
        check_int("ByteContext", "header_fraction", self.header_fraction, 2)
        check_int("ByteContext", "length", self.length, self.header_fraction, " (a header of at least one byte)")
        if self.length - self.header < self.marks:
            raise ArgumentError(f"ByteContext: marks must fit after the {self.header}-byte header "
                                f"(<= {self.length - self.header}); got {self.marks}")

    @property
    def header(self) -> int:
        """Bytes of the header."""
        return self.length // self.header_fraction

    @property
    def num_classes(self) -> int:
        return 2

    def question_positions(self, inputs: torch.Tensor) -> torch.Tensor:
        """The marks: every ``+`` and ``-`` byte (the header and the words hold neither)."""
        return (inputs == _PLUS) | (inputs == _MINUS)

    def _sample(self, n, generator):
        g, length, head = generator, self.length, self.header
        rows = torch.arange(n).view(n, 1)
        inputs = random_words(n, length, g)
        negated = torch.rand(n, generator=g) < 0.5
        inputs[:, :head] = torch.where(negated, NEGATED, PLAIN).view(n, 1)
        places = head + torch.rand(n, length - head, generator=g).argsort(1)[:, :self.marks]
        plus = torch.rand(n, self.marks, generator=g) < 0.5
        inputs[rows, places] = torch.where(plus, _PLUS, _MINUS)
        targets = torch.full((n, length), IGNORE_INDEX, dtype=torch.long)
        targets[rows, places] = (plus ^ negated.view(n, 1)).long()
        return {"inputs": inputs, "targets": targets, "negated": negated}

    def decode(self, ids) -> str:
        """The text of a row of ``inputs``."""
        return decode(ids)

    def describe(self) -> str:
        return (f"byte_context: {self.length}-byte documents, {self.marks} marks whose stance the "
                f"{self.header}-byte header decides (tokens, 2 classes)")
