"""Byte-level documents for the long-range text tasks: token ids of bytes, and two kinds of filler text.

Token ids: 0 = padding, byte ``b`` -> ``b + 1`` (``VOCAB_SIZE`` = 257); ``decode`` gives the text back.

- ``random_words(n, length, generator)``: lowercase words separated by single spaces (each byte
  a space with probability 1/6, never two spaces in a row), drawn independently per row.
- ``shuffled_multiset(base, generator)``: each row of ``base`` in a random order (rows built from
  one multiset of bytes keep exactly its counts: a bag-of-bytes model sees nothing that varies).

Shapes: both return ``(n, length)`` int64 ids. Complexity: ``O(n length)``, vectorised.

Example:
    >>> import torch
    >>> from attnkit.lab.tasks.byte_docs import decode, encode, random_words
    >>> decode(encode("A=1"))
    'A=1'
    >>> text = decode(random_words(1, 40, torch.Generator().manual_seed(0))[0])
    >>> len(text), set(text) <= set("abcdefghijklmnopqrstuvwxyz "), "  " in text
    (40, True, False)
"""

from __future__ import annotations

import torch

__all__ = ["VOCAB_SIZE", "encode", "decode", "random_words", "shuffled_multiset", "letters"]

VOCAB_SIZE = 257
_SPACE = ord(" ") + 1
_LETTER_A = ord("a") + 1


def encode(text: str) -> list[int]:
    """Token ids of the ASCII ``text``."""
    return [b + 1 for b in text.encode("ascii")]


def decode(ids) -> str:
    """The text of a row of ids (padding dropped, bytes as Latin-1)."""
    ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    return bytes(i - 1 for i in ids if i != 0).decode("latin-1")


def letters(count: int) -> torch.Tensor:
    """Ids of the first ``count`` lowercase letters."""
    return torch.arange(_LETTER_A, _LETTER_A + count)


def random_words(n: int, length: int, generator: torch.Generator | None) -> torch.Tensor:
    """``(n, length)`` ids of lowercase words and single spaces."""
    out = _LETTER_A + torch.randint(0, 26, (n, length), generator=generator)
    space = torch.rand(n, length, generator=generator) < 1 / 6
    space[:, 1:] &= ~space[:, :-1]  # no two spaces in a row
    return out.masked_fill_(space, _SPACE)


def shuffled_multiset(base: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """``(n, D)``: each row of the ids ``base (n, D)`` in a random order."""
    order = torch.rand(base.shape, generator=generator).argsort(1)
    return base.gather(1, order)
