"""Shared pieces of the character-level sequence-to-sequence tasks: vocabulary, packing, decoding."""

from __future__ import annotations

from functools import lru_cache

import torch

from ...errors import ArgumentError
from .base import IGNORE_INDEX, Task

__all__ = ["PAD", "BOS", "EOS", "CharSeq2Seq"]

PAD, BOS, EOS = 0, 1, 2
_SPECIALS = ("<pad>", "<bos>", "<eos>")


@lru_cache(maxsize=32)
def _table(chars: str) -> dict[str, int]:
    return {c: i + len(_SPECIALS) for i, c in enumerate(chars)}


class CharSeq2Seq(Task):
    """Base of character-level seq2seq tasks sharing one vocabulary for source and target.

    Ids: ``PAD`` 0, ``BOS`` 1, ``EOS`` 2, then the characters of ``chars()`` in order.
    Batch (fixed sizes ``source_len`` and ``target_len`` for a given task):

    - ``inputs (n, source_len)``: source characters, EOS, PAD...
    - ``decoder_inputs (n, target_len)``: BOS, target characters, EOS, PAD... (teacher forcing)
    - ``targets (n, target_len)``: ``decoder_inputs`` shifted left by one: target characters,
      EOS, then -100 (what the decoder must emit at each step)
    - ``source_lengths``, ``target_lengths (n,)``: characters + 1 (the EOS).

    Subclasses define ``chars()``, ``max_source_chars``, ``max_target_chars`` and
    ``_pairs(n, generator) -> (sources, targets)`` as lists of strings.
    """

    kind = "seq2seq"

    def chars(self) -> str:
        raise NotImplementedError

    @property
    def max_source_chars(self) -> int:
        raise NotImplementedError

    @property
    def max_target_chars(self) -> int:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        return len(_SPECIALS) + len(self.chars())

    @property
    def num_classes(self) -> int:
        return self.vocab_size

    @property
    def source_len(self) -> int:
        return self.max_source_chars + 1

    @property
    def target_len(self) -> int:
        return self.max_target_chars + 2

    def encode(self, text: str) -> list[int]:
        """Character ids of ``text`` (no BOS/EOS)."""
        table = _table(self.chars())
        missing = sorted({c for c in text if c not in table})
        if missing:
            raise ArgumentError(f"{type(self).__name__}.encode: text has characters outside the vocabulary: {missing}")
        return [table[c] for c in text]

    def decode(self, ids) -> str:
        """Text of a row of ids: stops at EOS, skips PAD, BOS and -100."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        chars = self.chars()
        out = []
        for i in ids:
            if i == EOS:
                break
            if len(_SPECIALS) <= i < self.vocab_size:
                out.append(chars[i - len(_SPECIALS)])
        return "".join(out)

    def _sample(self, n, generator):
        sources, targets = self._pairs(n, generator)
        src = torch.full((n, self.source_len), PAD, dtype=torch.long)
        dec = torch.full((n, self.target_len), PAD, dtype=torch.long)
        for i, (s, t) in enumerate(zip(sources, targets, strict=True)):
            src[i, :len(s) + 1] = torch.tensor([*self.encode(s), EOS])
            dec[i, :len(t) + 2] = torch.tensor([BOS, *self.encode(t), EOS])
        labels = torch.cat([dec[:, 1:], torch.full((n, 1), PAD, dtype=torch.long)], dim=1)
        labels[labels == PAD] = IGNORE_INDEX
        return {
            "inputs": src, "decoder_inputs": dec, "targets": labels,
            "source_lengths": torch.tensor([len(s) + 1 for s in sources]),
            "target_lengths": torch.tensor([len(t) + 1 for t in targets]),
        }

    def _pairs(self, n, generator) -> tuple[list[str], list[str]]:
        raise NotImplementedError
