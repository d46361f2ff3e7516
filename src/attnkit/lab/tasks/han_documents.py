"""Documents whose label is decided by exactly one sentence (for hierarchical attention)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import check_int
from .base import Task, check_float, register

__all__ = ["HANDocuments"]


def _below(u: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """Uniform integers in ``[0, bound)`` from uniforms ``u`` (clamped: float rounding can reach ``bound``)."""
    return torch.minimum((u * bound).long(), bound - 1)


@register
@dataclass(frozen=True)
class HANDocuments(Task):
    """Classify documents of sentences; exactly one sentence decides the label.

    For Yang et al. 2016, "Hierarchical Attention Networks for Document Classification",
    NAACL (word attention inside sentences, then sentence attention, eqs. 5-10); the data are
    generated so the right sentence is known. Class ``c`` has a signal *pattern*: the two
    words ``A_c`` and ``B_c`` in the same sentence. The deciding sentence
    (``deciding_sentence``) holds ``A_label`` and ``B_label`` at two random positions among
    neutral words. Every other sentence holds neutral words and, with probability
    ``distractor_prob``, one signal word (``A_c`` or ``B_c`` of any class): a lone signal word
    decides nothing, and a bag of words over the whole document can see both halves of a
    wrong class's pattern in different sentences, so only a model that finds the sentence
    with a complete pattern is always right.

    Token ids: 0 = PAD; neutral words ``1 .. num_neutral``; then ``A_0, B_0, A_1, B_1, ...``.
    Sentences have ``min_words .. max_words`` words (uniform), padded with 0.

    Differences from the paper: generated documents stand in for Yelp/IMDB/Amazon reviews.

    Shapes:
        ``inputs (n, num_sentences, max_words)`` long, ``word_mask`` same shape, bool (True = a
        word), ``word_lengths (n, num_sentences)``, ``deciding_sentence (n,)``, ``targets (n,)``.

    Complexity: ``O(n num_sentences max_words)`` per batch, vectorised.

    Args:
        num_classes: labels (each with its own pattern).
        num_sentences: sentences per document (S).
        max_words, min_words: sentence length range (min_words >= 2).
        num_neutral: neutral vocabulary size.
        distractor_prob: chance that a non-deciding sentence holds one signal word.

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("han_documents", num_sentences=3, max_words=5)
        >>> batch = task.sample(4, generator=torch.Generator().manual_seed(0))
        >>> batch["inputs"].shape, batch["deciding_sentence"].shape, task.vocab_size
        (torch.Size([4, 3, 5]), torch.Size([4]), 45)
    """

    name: ClassVar[str] = "han_documents"
    kind: ClassVar[str] = "classify"

    num_classes: int = 2
    num_sentences: int = 6
    max_words: int = 8
    min_words: int = 4
    num_neutral: int = 40
    distractor_prob: float = 0.5

    def __post_init__(self):
        check_int("HANDocuments", "num_classes", self.num_classes, 2)
        check_int("HANDocuments", "num_sentences", self.num_sentences, 1)
        check_int("HANDocuments", "min_words", self.min_words, 2, " (a pattern needs two words)")
        check_int("HANDocuments", "max_words", self.max_words, self.min_words, " (= min_words)")
        check_int("HANDocuments", "num_neutral", self.num_neutral, 1)
        check_float("HANDocuments", "distractor_prob", self.distractor_prob, 0.0, 1.0)

    @property
    def vocab_size(self) -> int:
        return 1 + self.num_neutral + 2 * self.num_classes

    def _sample(self, n, generator):
        s, w, g = self.num_sentences, self.max_words, generator
        lengths = torch.randint(self.min_words, w + 1, (n, s), generator=g)
        words = torch.randint(1, 1 + self.num_neutral, (n, s, w), generator=g)
        labels = torch.randint(0, self.num_classes, (n,), generator=g)
        deciding = torch.randint(0, s, (n,), generator=g)
        signal = 1 + self.num_neutral  # id of A_0
        # one distractor word per sentence, at a random position, in a random subset of sentences
        slot = _below(torch.rand(n, s, generator=g), lengths)  # (n, S) position < length
        word = torch.randint(signal, signal + 2 * self.num_classes, (n, s), generator=g)
        keep = torch.rand(n, s, generator=g) < self.distractor_prob
        keep[torch.arange(n), deciding] = False
        rows, sents = keep.nonzero(as_tuple=True)
        words[rows, sents, slot[rows, sents]] = word[rows, sents]
        # the deciding sentence: A_label and B_label at two distinct positions
        length = lengths[torch.arange(n), deciding]  # (n,)
        first = _below(torch.rand(n, generator=g), length)
        second = (first + 1 + _below(torch.rand(n, generator=g), length - 1)) % length
        ex = torch.arange(n)
        words[ex, deciding, first] = signal + 2 * labels
        words[ex, deciding, second] = signal + 2 * labels + 1
        mask = torch.arange(w) < lengths.unsqueeze(-1)  # (n, S, W)
        return {"inputs": words.masked_fill(~mask, 0), "word_mask": mask, "word_lengths": lengths,
                "deciding_sentence": deciding, "targets": labels}

    def describe(self) -> str:
        return (f"han_documents: {self.num_classes}-class documents of {self.num_sentences} sentences x "
                f"{self.min_words}-{self.max_words} words, one deciding sentence, vocab {self.vocab_size} "
                f"(classify)")
