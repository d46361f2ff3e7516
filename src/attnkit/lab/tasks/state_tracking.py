"""State tracking: parity, counting modulo m, and word problems of the permutation groups S3, S5 and A5.

Each example is a sequence of group elements and its target at every position is the running
product of the elements so far: the state a model must carry along the sequence. Merrill et al.
2024 ("The Illusion of State in State-Space Models", arXiv:2404.08819) show that S5's word problem
is beyond linear recurrences with diagonal non-negative transitions, and Grazzi et al. 2025
("Unlocking State-Tracking in Linear RNNs Through Negative Eigenvalues", ICLR 2025,
arXiv:2411.12537, Sec. 5) that even parity needs a transition with a negative eigenvalue: a
DeltaNet whose ``beta`` lies in [0, 2] instead of [0, 1] learns it. Their split trains on short
sequences (lengths up to 40) and tests on longer ones (up to 256); ``scored_from`` leaves the
first positions unscored, so a test task scores only the states beyond the training length.

- :class:`ModularCount`: bits; the target is the number of ones so far modulo ``modulus``
  (the cyclic group Z_m).
- :class:`Parity`: :class:`ModularCount` with ``modulus = 2``.
- :class:`WordProblem`: elements of ``group`` ("S3", "S5" or "A5") as ids; the target is the id
  of the running composition ``p_t = x_t o p_{t-1}`` (``p_1 = x_1``; ``(a o b)(i) = a(b(i))``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cache
from typing import ClassVar

import torch

from ...errors import ArgumentError, check_int
from .base import IGNORE_INDEX, Task, register

__all__ = ["ModularCount", "Parity", "WordProblem", "S3WordProblem", "A5WordProblem", "GROUPS", "permutations",
           "composition_table"]

GROUPS = ("S3", "S5", "A5")


def _even(perm: tuple[int, ...]) -> bool:
    inversions = sum(perm[i] > perm[j] for i in range(len(perm)) for j in range(i + 1, len(perm)))
    return inversions % 2 == 0


@cache
def permutations(group: str) -> tuple[tuple[int, ...], ...]:
    """The elements of ``group`` as permutation tuples, identity first (id = index in this tuple)."""
    if group not in GROUPS:
        raise ArgumentError(f"permutations: group must be one of {GROUPS}; got {group!r}")
    n = int(group[1])
    perms = list(itertools.permutations(range(n)))  # lexicographic: the identity comes first
    return tuple(p for p in perms if group[0] == "S" or _even(p))


@cache
def composition_table(group: str) -> torch.Tensor:
    """``table[a, b]`` = id of ``a o b`` (``(a o b)(i) = a(b(i))``), shape ``(|G|, |G|)``, long."""
    perms = permutations(group)
    index = {p: i for i, p in enumerate(perms)}
    return torch.tensor([[index[tuple(a[b[i]] for i in range(len(a)))] for b in perms] for a in perms])


def _running(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Running products ``p_t = table[x_t, p_{t-1}]`` of ``x (n, L)`` ids, ``(n, L)``."""
    out = torch.empty_like(x)
    state = x[:, 0]
    out[:, 0] = state
    for t in range(1, x.shape[1]):
        state = table[x[:, t], state]
        out[:, t] = state
    return out


def _scored(targets: torch.Tensor, scored_from: int) -> torch.Tensor:
    targets[:, :scored_from] = IGNORE_INDEX
    return targets


def _check_lengths(who: str, seq_len: int, scored_from: int) -> None:
    check_int(who, "seq_len", seq_len, 1)
    check_int(who, "scored_from", scored_from, 0)
    if scored_from >= seq_len:
        raise ArgumentError(f"{who}: scored_from must be below seq_len ({seq_len}); got {scored_from}")


@register
@dataclass(frozen=True)
class ModularCount(Task):
    """Counting modulo m: the number of ones among the bits so far, modulo ``modulus``, at every position.

    The word problem of the cyclic group Z_m (Grazzi et al. 2025, arXiv:2411.12537, Sec. 5.1,
    "modular arithmetic"; Merrill et al. 2024, arXiv:2404.08819): the state is one of ``modulus``
    values and each 1 rotates it.

    Token ids: 0 and 1 (the bits, each drawn with probability 1/2). Targets: ``0 .. modulus - 1``;
    positions before ``scored_from`` are -100.

    Shapes: ``inputs (n, seq_len)``, ``targets (n, seq_len)``.

    Complexity: ``O(n seq_len)`` per batch (a cumulative sum).

    Args:
        seq_len: sequence length.
        modulus: m >= 2.
        scored_from: first scored position (the training length, for a test of length generalisation).

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("modular_count", seq_len=6, modulus=3)
        >>> batch = task.sample(1, generator=torch.Generator().manual_seed(0))
        >>> bool((batch["targets"] == batch["inputs"].cumsum(1) % 3).all()), task.num_classes
        (True, 3)
    """

    name: ClassVar[str] = "modular_count"
    kind: ClassVar[str] = "tokens"

    seq_len: int = 40
    modulus: int = 3
    scored_from: int = 0

    def __post_init__(self):
        _check_lengths(type(self).__name__, self.seq_len, self.scored_from)
        check_int(type(self).__name__, "modulus", self.modulus, 2)

    @property
    def vocab_size(self) -> int:
        return 2

    @property
    def num_classes(self) -> int:
        return self.modulus

    def _sample(self, n, generator):
        bits = torch.randint(0, 2, (n, self.seq_len), generator=generator)
        return {"inputs": bits, "targets": _scored(bits.cumsum(1) % self.modulus, self.scored_from)}

    def describe(self) -> str:
        return (f"{self.name}: ones so far modulo {self.modulus} at each of {self.seq_len} bits, scored from "
                f"position {self.scored_from} (tokens; accuracy, chance {100 / self.modulus:.0f} %)")


@register
@dataclass(frozen=True)
class Parity(ModularCount):
    """Parity: :class:`ModularCount` with ``modulus = 2`` (the simplest state a linear RNN with non-negative
    eigenvalues cannot track; Grazzi et al. 2025, arXiv:2411.12537, Theorem 1).

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("parity", seq_len=8, scored_from=4)
        >>> batch = task.sample(2, generator=torch.Generator().manual_seed(0))
        >>> batch["targets"][:, :4].tolist()
        [[-100, -100, -100, -100], [-100, -100, -100, -100]]
    """

    name: ClassVar[str] = "parity"

    modulus: int = 2

    def __post_init__(self):
        super().__post_init__()
        if self.modulus != 2:
            raise ArgumentError(f"Parity: modulus must be 2 (use modular_count for others); got {self.modulus}")


@register
@dataclass(frozen=True)
class WordProblem(Task):
    """The word problem of a permutation group: the running composition of the elements so far.

    Merrill et al. 2024 (arXiv:2404.08819, Sec. 4): S5 (and its simple subgroup A5) is NC1-complete,
    beyond any fixed-depth model with diagonal transitions; S3 is solvable. Grazzi et al. 2025
    (arXiv:2411.12537, Sec. 5.2) train on such sequences and test on longer ones.

    Token ids: the element ids of :func:`permutations` (``0`` is the identity), drawn uniformly.
    Targets: the id of ``p_t = x_t o p_{t-1}``; positions before ``scored_from`` are -100.

    Shapes: ``inputs (n, seq_len)``, ``targets (n, seq_len)``.

    Complexity: ``O(n seq_len)`` table look-ups per batch.

    Args:
        seq_len: sequence length.
        group: "S3" (6 elements), "S5" (120) or "A5" (60).
        scored_from: first scored position.

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("word_problem", seq_len=5, group="S3")
        >>> batch = task.sample(1, generator=torch.Generator().manual_seed(0))
        >>> task.vocab_size, task.num_classes, task.accuracy(batch["targets"], batch)
        (6, 6, 1.0)
    """

    name: ClassVar[str] = "word_problem"
    kind: ClassVar[str] = "tokens"

    seq_len: int = 40
    group: str = "S3"
    scored_from: int = 0

    def __post_init__(self):
        _check_lengths("WordProblem", self.seq_len, self.scored_from)
        if self.group not in GROUPS:
            raise ArgumentError(f"WordProblem: group must be one of {GROUPS}; got {self.group!r}")

    @property
    def vocab_size(self) -> int:
        return len(permutations(self.group))

    @property
    def num_classes(self) -> int:
        return self.vocab_size

    def _sample(self, n, generator):
        x = torch.randint(0, self.vocab_size, (n, self.seq_len), generator=generator)
        return {"inputs": x, "targets": _scored(_running(x, composition_table(self.group)), self.scored_from)}

    def describe(self) -> str:
        return (f"{self.name}: running product in {self.group} ({self.vocab_size} elements) at each of "
                f"{self.seq_len} positions, scored from position {self.scored_from} (tokens; accuracy, chance "
                f"{100 / self.vocab_size:.1f} %)")


@register
@dataclass(frozen=True)
class S3WordProblem(WordProblem):
    """:class:`WordProblem` of S3 under a name of its own (the tour's experiments are keyed by task name).

    Example:
        >>> from attnkit.lab import tasks
        >>> tasks.get("word_problem_s3").vocab_size
        6
    """

    name: ClassVar[str] = "word_problem_s3"

    def __post_init__(self):
        super().__post_init__()
        if self.group != "S3":
            raise ArgumentError(f"S3WordProblem: group must be 'S3' (use word_problem for others); got {self.group!r}")


@register
@dataclass(frozen=True)
class A5WordProblem(WordProblem):
    """:class:`WordProblem` of A5 under a name of its own (the tour's experiments are keyed by task name).

    Example:
        >>> from attnkit.lab import tasks
        >>> tasks.get("word_problem_a5").vocab_size
        60
    """

    name: ClassVar[str] = "word_problem_a5"

    group: str = "A5"

    def __post_init__(self):
        super().__post_init__()
        if self.group != "A5":
            raise ArgumentError(f"A5WordProblem: group must be 'A5' (use word_problem for others); got {self.group!r}")
