"""Multi-query associative recall over a long context: facts at the start, many queries at the end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import ArgumentError, check_int
from .base import IGNORE_INDEX, Task, register

__all__ = ["AssociativeRecall"]


@register
@dataclass(frozen=True)
class AssociativeRecall(Task):
    """Answer every query key with the value its fact gave, the facts ``length / 4`` tokens or more before.

    Multi-query associative recall (Arora et al. 2023, "Zoology", arXiv:2312.04927, Sec. 3.1) laid
    out as a multi-key needle test at long context (Hsieh et al. 2024, "RULER", arXiv:2404.06654,
    Sec. 3.1), read by a bidirectional encoder. A fact is one token that binds a key to a value,
    ``(k, v)``. The sequence has three parts::

        | facts region: 3/8 L        | gap: 1/4 L | queries region: 3/8 L         |
        | f (k2,v0) f f (k0,v3) f ... f f f f ... f | f k0 f f k2 f k0 ... f     |

    Each of the ``num_keys`` keys has one value; its fact is stated ``repeats`` times at random
    places of the facts region, the rest of which is filler (``filler`` kinds of noise token). Each
    key is asked ``queries`` times at random places of the queries region. The target at a query is
    the key's value (``-100`` elsewhere). Each value is held by exactly ``num_keys / num_values``
    keys, so every value is as likely at every query.

    What it tests: exact recall of distant content by its key, many times per sequence. Why it
    needs long range: every query is at least ``length / 4`` tokens after every fact, beyond any
    window shorter than that. Token counts do not decide it: they show which facts are stated, but
    not which of them a query asks for; the counts of the last tokens see queries and filler only.

    Token ids: 0 = padding (unused), filler ``1 .. filler``, key ``k`` = ``filler + 1 + k``, fact
    ``(k, v)`` = ``filler + 1 + num_keys + k num_values + v``.

    Shapes:
        ``inputs (n, length)`` long; ``targets (n, length)`` long, the value at each query and
        -100 elsewhere; ``values (n, num_keys)`` each key's value.

    Complexity: ``O(n length log length)`` per batch (a sort per region), vectorised.

    Args:
        length: tokens per sequence (>= 16; each region must hold its facts or queries).
        num_keys: keys per sequence, a multiple of ``num_values``.
        num_values: values (the classes), >= 2.
        repeats: times each fact is stated.
        queries: times each key is asked.
        filler: kinds of filler token (>= 1).

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("associative_recall", length=128, repeats=2, queries=2)
        >>> batch = task.sample(2, generator=torch.Generator().manual_seed(0))
        >>> batch["inputs"].shape, int((batch["targets"][0] != -100).sum()), task.num_classes
        (torch.Size([2, 128]), 16, 4)
    """

    name: ClassVar[str] = "associative_recall"
    kind: ClassVar[str] = "tokens"

    length: int = 2048
    num_keys: int = 8
    num_values: int = 4
    repeats: int = 24
    queries: int = 8
    filler: int = 4

    def __post_init__(self):
        check_int("AssociativeRecall", "num_values", self.num_values, 2)
        check_int("AssociativeRecall", "num_keys", self.num_keys, self.num_values)
        if self.num_keys % self.num_values:
            raise ArgumentError(f"AssociativeRecall: num_keys must be a multiple of num_values = {self.num_values} "
                                f"(each value held by as many keys); got {self.num_keys}")
        for name in ("repeats", "queries", "filler"):
            check_int("AssociativeRecall", name, getattr(self, name), 1)
        check_int("AssociativeRecall", "length", self.length, 16)
        need = max(self.num_keys * self.repeats, self.num_keys * self.queries)
        if self.region < need:
            raise ArgumentError(f"AssociativeRecall: length must give each region (3/8 of it) room for "
                                f"{need} facts or queries; got {self.length} (regions of {self.region})")

    @property
    def region(self) -> int:
        """Tokens of the facts region and of the queries region (``3 length / 8``)."""
        return 3 * self.length // 8

    @property
    def vocab_size(self) -> int:
        return 1 + self.filler + self.num_keys + self.num_keys * self.num_values

    @property
    def num_classes(self) -> int:
        return self.num_values

    def _places(self, n: int, count: int, generator) -> torch.Tensor:
        """``(n, count)`` distinct positions in ``0 .. region - 1``, uniformly drawn."""
        return torch.rand(n, self.region, generator=generator).argsort(1)[:, :count]

    def question_positions(self, inputs: torch.Tensor) -> torch.Tensor:
        """The queries: every key token (ids ``filler + 1 .. filler + num_keys``; facts and filler use others)."""
        return (inputs > self.filler) & (inputs <= self.filler + self.num_keys)

    def _sample(self, n, generator):
        g, k, length = generator, self.num_keys, self.length
        rows = torch.arange(n).view(n, 1)
        inputs = 1 + torch.randint(0, self.filler, (n, length), generator=g)
        values = (torch.arange(k) % self.num_values)[torch.rand(n, k, generator=g).argsort(1)]  # (n, k), balanced
        facts = self.filler + 1 + k + torch.arange(k) * self.num_values + values  # (n, k) fact ids
        inputs[rows, self._places(n, k * self.repeats, g)] = facts.repeat(1, self.repeats)
        asked = length - self.region + self._places(n, k * self.queries, g)
        inputs[rows, asked] = (self.filler + 1 + torch.arange(k)).repeat(self.queries)
        targets = torch.full((n, length), IGNORE_INDEX, dtype=torch.long)
        targets[rows, asked] = values.repeat(1, self.queries)
        return {"inputs": inputs, "targets": targets, "values": values}

    def describe(self) -> str:
        return (f"associative_recall: {self.num_keys} facts stated {self.repeats} times each in the first 3/8 of "
                f"{self.length} tokens, each key asked {self.queries} times in the last 3/8 (tokens, "
                f"{self.num_values} values)")
