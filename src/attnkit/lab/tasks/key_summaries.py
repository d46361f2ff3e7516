"""Summaries of generated documents whose key words recur: the summary lists each key word once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import check_int
from .base import Task, python_rng, register

__all__ = ["KeySummaries", "PAD", "UNK", "BOS", "EOS"]

PAD, UNK, BOS, EOS = 0, 1, 2, 3


@register
@dataclass(frozen=True)
class KeySummaries(Task):
    """Summarise a document by its key words in order of first mention; some keys are mentioned twice.

    For See et al. 2017 ("Get To The Point: Summarization with Pointer-Generator Networks",
    arXiv:1704.04368, Sec. 2.3 and Fig. 4): an attention decoder that copies from the source
    tends to repeat itself, and coverage (the running sum of past attention) counters it. Here
    the source repeats some of its content, which tempts a copying decoder to mention a key
    twice::

        document:  f k3 f f k7 k1 f k3 f k9 f k7 f ...     summary:  k3 k7 k1 k9 </s>

    ``num_keys`` distinct key words appear in the document in order at random positions;
    ``repeats`` of them are mentioned a second time at a random later position; the rest is
    filler. The summary lists each key once, in order of first mention, then EOS: a correct
    summary has no repeated word, so every repeated n-gram of a decoded summary is an error.

    Token ids: PAD 0, UNK 1, BOS 2, EOS 3, keys ``4 .. 3 + num_key_words``, then fillers.
    Batch layout as the ``seq2seq`` kind: ``inputs (n, doc_len)``, ``decoder_inputs (n,
    num_keys + 1)`` (BOS, keys), ``targets (n, num_keys + 1)`` (keys, EOS), ``source_lengths``.

    Complexity: ``O(n doc_len)`` per batch (a Python loop per example).

    Args:
        doc_len: document length (>= num_keys + repeats).
        num_keys: key words per document.
        repeats: keys mentioned twice (<= num_keys).
        num_key_words, num_fillers: vocabulary sizes (num_key_words >= num_keys).

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("key_summaries", doc_len=8, num_keys=3, repeats=1)
        >>> batch = task.sample(1, generator=torch.Generator().manual_seed(0))
        >>> keys = [t for t in batch["inputs"][0].tolist() if 4 <= t < 4 + task.num_key_words]
        >>> len(keys), list(dict.fromkeys(keys)) == batch["targets"][0, :3].tolist()
        (4, True)
    """

    name: ClassVar[str] = "key_summaries"
    kind: ClassVar[str] = "seq2seq"

    doc_len: int = 20
    num_keys: int = 5
    repeats: int = 2
    num_key_words: int = 16
    num_fillers: int = 8

    def __post_init__(self):
        who = "KeySummaries"
        check_int(who, "num_keys", self.num_keys, 1)
        check_int(who, "repeats", self.repeats, 0)
        check_int(who, "num_keys", self.num_keys, self.repeats, " (= repeats)")
        check_int(who, "doc_len", self.doc_len, self.num_keys + self.repeats, " (= num_keys + repeats)")
        check_int(who, "num_key_words", self.num_key_words, self.num_keys, " (= num_keys)")
        check_int(who, "num_fillers", self.num_fillers, 1)

    @property
    def vocab_size(self) -> int:
        return 4 + self.num_key_words + self.num_fillers

    @property
    def num_classes(self) -> int:
        return self.vocab_size

    @property
    def target_len(self) -> int:
        return self.num_keys + 1

    def _one(self, rng) -> tuple[list[int], list[int]]:
        keys = [4 + k for k in rng.sample(range(self.num_key_words), self.num_keys)]
        mentions = list(keys)
        for k in rng.sample(keys, self.repeats):  # a second mention somewhere after the first
            mentions.insert(rng.randint(mentions.index(k) + 1, len(mentions)), k)
        slots = sorted(rng.sample(range(self.doc_len), len(mentions)))
        filler0 = 4 + self.num_key_words
        doc = [filler0 + rng.randrange(self.num_fillers) for _ in range(self.doc_len)]
        for slot, k in zip(slots, mentions, strict=True):
            doc[slot] = k
        return doc, keys

    def _sample(self, n, generator):
        rng = python_rng(generator)
        docs, keys = zip(*(self._one(rng) for _ in range(n)), strict=True)
        keys = torch.tensor(keys)
        return {"inputs": torch.tensor(docs), "decoder_inputs": torch.cat([torch.full((n, 1), BOS), keys], 1),
                "targets": torch.cat([keys, torch.full((n, 1), EOS)], 1),
                "source_lengths": torch.full((n,), self.doc_len)}

    def describe(self) -> str:
        return (f"key_summaries: list the {self.num_keys} key words of a {self.doc_len}-token document once each "
                f"({self.repeats} are mentioned twice) (seq2seq; exact match)")
