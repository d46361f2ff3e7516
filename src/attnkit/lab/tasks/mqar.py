"""Multi-query associative recall (MQAR)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import ArgumentError, check_int
from .base import IGNORE_INDEX, Task, register

__all__ = ["MQAR"]


@register
@dataclass(frozen=True)
class MQAR(Task):
    """Multi-query associative recall: recall the value bound to each queried key.

    Arora et al. 2023, "Zoology: Measuring and Improving Recall in Efficient Language
    Models", arXiv:2312.04927, Sec. 3.1 (MQAR). Layout of one example::

        k1 v1 k2 v2 ... kP vP  F F ... F  q1 q2 ... qQ
        \\__ num_pairs pairs _/ \\_ gap _/ \\num_queries/

    Keys are distinct within an example, values are drawn with replacement, key and
    value vocabularies are disjoint. The queries are a random subset of the example's
    keys in random order, each once. ``targets`` holds, at each query position, the value
    bound to that key, and -100 everywhere else.

    Token ids: 0 = filler ``F``; keys ``1 .. num_keys``; values ``num_keys + 1 .. num_keys +
    num_values``. Targets are value ids in the same id space, so an output layer of
    ``vocab_size`` = ``num_classes`` classes fits.

    Differences from the paper: Zoology puts each query's answer at the next position for a
    causal language model (``... q v ...``), which would show the answer to a bidirectional
    model; here the label sits *on* the query position and the next token is the next query,
    so no layout leaks the answer. Queries follow all pairs (the paper scatters them over the
    rest of the sequence); ``gap`` filler tokens between the last pair and the first query put
    every pair token out of reach of a sliding window that looks back ``<= gap`` positions.

    Shapes:
        ``inputs (n, seq_len)`` long, ``targets (n, seq_len)`` long,
        ``seq_len = 2 num_pairs + gap + num_queries``.

    Complexity: ``O(n (num_keys + seq_len))`` per batch, vectorised.

    Args:
        num_pairs: key-value pairs per example (P).
        num_queries: queries per example (Q <= P); default P.
        num_keys: size of the key vocabulary (>= P).
        num_values: size of the value vocabulary.
        gap: filler tokens between the pairs and the queries.

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("mqar", num_pairs=3, num_queries=2, num_keys=5, num_values=4, gap=1)
        >>> batch = task.sample(2, generator=torch.Generator().manual_seed(0))
        >>> batch["inputs"].shape, task.vocab_size
        (torch.Size([2, 9]), 10)
        >>> task.accuracy(batch["targets"], batch)
        1.0
    """

    name: ClassVar[str] = "mqar"
    kind: ClassVar[str] = "tokens"

    num_pairs: int = 8
    num_queries: int | None = None
    num_keys: int = 64
    num_values: int = 64
    gap: int = 0

    def __post_init__(self):
        check_int("MQAR", "num_pairs", self.num_pairs, 1)
        if self.num_queries is None:
            object.__setattr__(self, "num_queries", self.num_pairs)
        check_int("MQAR", "num_queries", self.num_queries, 1)
        if self.num_queries > self.num_pairs:
            raise ArgumentError(f"MQAR: num_queries must be <= num_pairs = {self.num_pairs}; got {self.num_queries}")
        check_int("MQAR", "num_keys", self.num_keys, self.num_pairs, " (= num_pairs, keys are distinct)")
        check_int("MQAR", "num_values", self.num_values, 1)
        check_int("MQAR", "gap", self.gap, 0)

    @property
    def vocab_size(self) -> int:
        return 1 + self.num_keys + self.num_values

    @property
    def num_classes(self) -> int:
        return self.vocab_size

    @property
    def seq_len(self) -> int:
        return 2 * self.num_pairs + self.gap + self.num_queries

    def _sample(self, n, generator):
        p, q = self.num_pairs, self.num_queries
        keys = torch.rand(n, self.num_keys, generator=generator).argsort(-1)[:, :p] + 1  # (n, P) distinct
        values = torch.randint(0, self.num_values, (n, p), generator=generator) + 1 + self.num_keys
        chosen = torch.rand(n, p, generator=generator).argsort(-1)[:, :q]  # (n, Q) distinct pair indices
        pairs = torch.stack([keys, values], dim=-1).flatten(1)  # (n, 2P): k1 v1 k2 v2 ...
        filler = torch.zeros(n, self.gap, dtype=torch.long)
        inputs = torch.cat([pairs, filler, keys.gather(1, chosen)], dim=1)  # (n, seq_len)
        targets = torch.full_like(inputs, IGNORE_INDEX)
        targets[:, 2 * p + self.gap:] = values.gather(1, chosen)
        return {"inputs": inputs, "targets": targets}

    def describe(self) -> str:
        return (f"mqar: multi-query associative recall, {self.num_pairs} pairs, {self.num_queries} queries, "
                f"gap {self.gap}, vocab {self.vocab_size}, length {self.seq_len} (tokens; query accuracy)")
