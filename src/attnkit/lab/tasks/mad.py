"""The MAD synthetic tasks: in-context, fuzzy and noisy recall, selective copying, memorization and compression.

Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid Architectures" (ICML 2024,
arXiv:2403.17844), Sec. 3 and App. B: six small token tasks whose scores predict how an
architecture scales. Selective copying is :class:`~attnkit.lab.tasks.SelectiveCopy` at MAD's sizes
(:class:`MADSelectiveCopy`). The defaults here are the paper's easiest setting of each task (vocabulary 16,
length 128 for the recall tasks; length 32 for compression and memorization).

- :class:`InContextRecall`: key-value pairs ``k v k v ...`` whose map is drawn per sequence;
  after a key seen before, its value is predicted.
- :class:`FuzzyRecall`: keys and values are strings of 1 to ``key_len`` / ``value_len`` tokens.
- :class:`NoisyRecall`: noise tokens (of their own vocabulary) are scattered between the pairs.
- :class:`Memorization`: one fixed map for every sequence (drawn from ``map_seed``): the values
  must be stored in the weights, not read from the context.
- :class:`Compression`: a sequence, a compression token, then the positions in random order;
  at each position token the model predicts the token that stood there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import ArgumentError, check_int
from .base import IGNORE_INDEX, Task, check_float, python_rng, register
from .selective_copy import SelectiveCopy

__all__ = ["InContextRecall", "FuzzyRecall", "NoisyRecall", "MADSelectiveCopy", "Memorization", "Compression",
           "MAD_TASKS"]

PAD = 0


@dataclass(frozen=True)
class _Recall(Task):
    """Shared layout of the three recall tasks (see the subclasses): ids ``0`` pad, keys ``1 .. vocab // 2``,
    values ``vocab // 2 + 1 .. vocab``, noise ``vocab + 1 .. vocab + num_noise`` (``vocab_size = vocab + num_noise
    + 1`` ids in all).

    One sequence: per example, ``vocab // 2`` distinct key strings (lengths ``1 .. key_len``), each bound
    to a value string (lengths ``1 .. value_len``); then pairs of a random key and its value, with a noise
    token before a pair with probability ``noise``, until ``seq_len`` (a pair that does not fit is cut and
    the rest padded). Each value token of a pair whose key string occurred earlier in the sequence is the
    target at the position before it (next-token prediction: a causal model's task)."""

    kind: ClassVar[str] = "tokens"
    needs_causal_model: ClassVar[bool] = True

    vocab: int = 16
    seq_len: int = 128
    key_len: int = 1
    value_len: int = 1
    noise: float = 0.0
    num_noise: int = 0

    def __post_init__(self):
        who = type(self).__name__
        check_int(who, "vocab", self.vocab, 4)
        check_int(who, "seq_len", self.seq_len, 4)
        check_int(who, "key_len", self.key_len, 1)
        check_int(who, "value_len", self.value_len, 1)
        check_float(who, "noise", self.noise, 0.0, 1.0, high_open=True)
        check_int(who, "num_noise", self.num_noise, 1 if self.noise > 0 else 0)

    @property
    def vocab_size(self) -> int:
        return 1 + self.vocab + self.num_noise

    @property
    def num_classes(self) -> int:
        return self.vocab_size

    def _strings(self, rng, low: int, count: int, longest: int, distinct: int) -> list[tuple[int, ...]]:
        found: set[tuple[int, ...]] = set()
        while len(found) < distinct:
            found.add(tuple(rng.randrange(low, low + count) for _ in range(rng.randint(1, longest))))
        return sorted(found)

    def _one(self, rng) -> tuple[list[int], list[int]]:
        half = self.vocab // 2
        keys = self._strings(rng, 1, half, self.key_len, half)
        bound = {k: tuple(rng.randrange(half + 1, self.vocab + 1) for _ in range(rng.randint(1, self.value_len)))
                 for k in keys}
        tokens: list[int] = []
        labels: list[int] = []
        seen: set = set()
        while len(tokens) < self.seq_len:
            if self.noise and rng.random() < self.noise:
                tokens.append(self.vocab + 1 + rng.randrange(self.num_noise))
                labels.append(IGNORE_INDEX)
                continue
            key = keys[rng.randrange(len(keys))]
            tokens += key
            labels += [IGNORE_INDEX] * len(key)
            for v in bound[key]:
                if key in seen:
                    labels[-1] = v  # the value token is predicted from the position before it
                tokens.append(v)
                labels.append(IGNORE_INDEX)
            seen.add(key)
        tokens, labels = tokens[:self.seq_len], labels[:self.seq_len]
        labels[-1] = IGNORE_INDEX  # its next token lies past the end
        return tokens, labels

    def _sample(self, n, generator):
        rng = python_rng(generator)
        rows = [self._one(rng) for _ in range(n)]
        return {"inputs": torch.tensor([r[0] for r in rows]), "targets": torch.tensor([r[1] for r in rows])}

    def describe(self) -> str:
        noise = f", noise {self.noise:.0%} of {self.num_noise} tokens" if self.noise else ""
        return (f"{self.name}: recall values (length <= {self.value_len}) of keys (length <= {self.key_len}) "
                f"seen before, vocabulary {self.vocab}, length {self.seq_len}{noise} (tokens; accuracy)")


@register
@dataclass(frozen=True)
class InContextRecall(_Recall):
    """MAD's in-context recall (Poli et al. 2024, arXiv:2403.17844, Sec. 3.1): single-token keys and values.

    Shapes: ``inputs (n, seq_len)``, ``targets (n, seq_len)``. Complexity: ``O(n seq_len)`` per batch (Python).

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("in_context_recall", seq_len=12, vocab=4)
        >>> batch = task.sample(1, generator=torch.Generator().manual_seed(0))
        >>> batch["inputs"].shape, task.accuracy(batch["targets"], batch)
        (torch.Size([1, 12]), 1.0)
    """

    name: ClassVar[str] = "in_context_recall"


@register
@dataclass(frozen=True)
class FuzzyRecall(_Recall):
    """MAD's fuzzy recall (Sec. 3.1): keys and values of 1 to 3 tokens, so a key's end and a value's length must
    be found from the tokens themselves. Shapes and complexity as :class:`InContextRecall`.

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("fuzzy_recall")
        >>> task.key_len, task.value_len, task.sample(2)["inputs"].shape
        (3, 3, torch.Size([2, 128]))
    """

    name: ClassVar[str] = "fuzzy_recall"

    key_len: int = 3
    value_len: int = 3


@register
@dataclass(frozen=True)
class NoisyRecall(_Recall):
    """MAD's noisy recall (Sec. 3.1): noise tokens, of a vocabulary of their own, before a pair with probability
    ``noise``; they carry nothing to recall. Shapes and complexity as :class:`InContextRecall`.

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("noisy_recall")
        >>> task.noise, task.num_noise, task.vocab_size
        (0.2, 4, 21)
    """

    name: ClassVar[str] = "noisy_recall"

    noise: float = 0.2
    num_noise: int = 4


@register
@dataclass(frozen=True)
class MADSelectiveCopy(SelectiveCopy):
    """MAD's selective copying (Sec. 3.1): :class:`~attnkit.lab.tasks.SelectiveCopy` with the paper's easiest sizes,
    16 tokens of a vocabulary of 16 among 240 positions (length 256).

    Example:
        >>> from attnkit.lab import tasks
        >>> tasks.get("mad_selective_copy").seq_len
        256
    """

    name: ClassVar[str] = "mad_selective_copy"

    num_tokens: int = 16
    context_len: int = 240
    data_vocab: int = 16

    def describe(self) -> str:
        return f"mad_{super().describe()}"


@register
@dataclass(frozen=True)
class Memorization(Task):
    """MAD's memorization (Sec. 3.1): one key-value map for every sequence, learned into the weights.

    Layout ``k1 I k2 I ...``: keys ``1 .. num_keys`` drawn uniformly, each followed by the insert token
    ``I`` (id ``num_keys + num_values + 1``); the target at each key position is its value (ids
    ``num_keys + 1 .. num_keys + num_values``) under the map drawn from ``map_seed``, so no input shows it.

    Shapes: ``inputs (n, seq_len)``, ``targets (n, seq_len)``. Complexity: ``O(n seq_len)`` per batch.

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("memorization", num_keys=4, num_values=4, seq_len=6)
        >>> a, b = task.sample(64), task.sample(64)
        >>> keys = torch.cat([a["inputs"][:, ::2], b["inputs"][:, ::2]]).flatten()
        >>> vals = torch.cat([a["targets"][:, ::2], b["targets"][:, ::2]]).flatten()
        >>> all(len(set(vals[keys == k].tolist())) == 1 for k in range(1, 5))  # one value per key, always
        True
    """

    name: ClassVar[str] = "memorization"
    kind: ClassVar[str] = "tokens"

    num_keys: int = 128
    num_values: int = 128
    seq_len: int = 32
    map_seed: int = 0

    def __post_init__(self):
        check_int("Memorization", "num_keys", self.num_keys, 1)
        check_int("Memorization", "num_values", self.num_values, 1)
        if check_int("Memorization", "seq_len", self.seq_len, 2) % 2:
            raise ArgumentError(f"Memorization: seq_len must be even (pairs of a key and the insert token); "
                                f"got {self.seq_len}")
        check_int("Memorization", "map_seed", self.map_seed, 0)

    @property
    def vocab_size(self) -> int:
        return self.num_keys + self.num_values + 2

    @property
    def num_classes(self) -> int:
        return self.vocab_size

    def value_map(self) -> torch.Tensor:
        """``(num_keys + 1,)``: the value id of each key id (index 0 unused), the same for every batch."""
        values = torch.randint(0, self.num_values, (self.num_keys,), generator=torch.Generator().manual_seed(
            self.map_seed))
        return torch.cat([torch.zeros(1, dtype=torch.long), self.num_keys + 1 + values])

    def _sample(self, n, generator):
        keys = torch.randint(1, self.num_keys + 1, (n, self.seq_len // 2), generator=generator)
        inputs = torch.full((n, self.seq_len), self.num_keys + self.num_values + 1)
        inputs[:, ::2] = keys
        targets = torch.full_like(inputs, IGNORE_INDEX)
        targets[:, ::2] = self.value_map()[keys]
        return {"inputs": inputs, "targets": targets}

    def describe(self) -> str:
        return (f"memorization: a fixed map of {self.num_keys} keys to {self.num_values} values, {self.seq_len // 2} "
                f"keys a sequence (tokens; accuracy)")


@register
@dataclass(frozen=True)
class Compression(Task):
    """MAD's compression (Sec. 3.1): read a sequence, then reproduce any of its tokens from its position alone.

    Layout ``x_1 .. x_L  C  P_{s(1)} .. P_{s(L)}``: data tokens (ids ``1 .. vocab``), the compression token
    ``C`` (id ``vocab + 1``), then one position token per position (``P_i`` = id ``vocab + 1 + i``,
    ``i`` in ``1 .. L``) in a random order ``s``; the target at ``P_i`` is ``x_i``. A recurrence must hold the
    whole sequence in its state at ``C``.

    Differences from the paper: MAD decodes the model's output at ``C`` with a small MLP given the queried
    position; here the position tokens follow as inputs, so the task fits the token-task contract.

    Shapes: ``inputs (n, seq_len)``, ``targets (n, seq_len)``, ``seq_len = 2 length + 1``.

    Complexity: ``O(n L log L)`` per batch (a sort).

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("compression", length=4, vocab=3)
        >>> batch = task.sample(1, generator=torch.Generator().manual_seed(0))
        >>> batch["inputs"].shape, task.seq_len, task.accuracy(batch["targets"], batch)
        (torch.Size([1, 9]), 9, 1.0)
    """

    name: ClassVar[str] = "compression"
    kind: ClassVar[str] = "tokens"

    vocab: int = 16
    length: int = 32

    def __post_init__(self):
        check_int("Compression", "vocab", self.vocab, 2)
        check_int("Compression", "length", self.length, 1)

    @property
    def seq_len(self) -> int:
        return 2 * self.length + 1

    @property
    def vocab_size(self) -> int:
        return self.vocab + 2 + self.length

    @property
    def num_classes(self) -> int:
        return self.vocab_size

    def _sample(self, n, generator):
        length = self.length
        data = torch.randint(1, self.vocab + 1, (n, length), generator=generator)
        order = torch.rand(n, length, generator=generator).argsort(-1)  # (n, L): the queried positions
        inputs = torch.cat([data, torch.full((n, 1), self.vocab + 1), self.vocab + 2 + order], 1)
        targets = torch.full_like(inputs, IGNORE_INDEX)
        targets[:, length + 1:] = data.gather(1, order)
        return {"inputs": inputs, "targets": targets}

    def describe(self) -> str:
        return (f"compression: {self.length} tokens of {self.vocab}, then each recalled from its position "
                f"alone (tokens; accuracy)")


MAD_TASKS = ("in_context_recall", "fuzzy_recall", "noisy_recall", "mad_selective_copy", "compression", "memorization")
"""MAD's six tasks by registered name; their defaults are the paper's easiest setting."""
