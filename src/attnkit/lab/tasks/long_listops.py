"""Long ListOps: Long Range Arena's ListOps at 500-2000 tokens, each expression grown to a drawn length."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import ArgumentError, check_int
from .base import Task, check_float, register
from .listops import OPERATORS, TOKENS

__all__ = ["LongListOps"]

_OPERATOR_IDS = tuple(TOKENS.index(op) for op in OPERATORS)
_CLOSE = TOKENS.index("]")  # digit d has id TOKENS.index(str(d)) = d + 1
_OPEN, _DIGIT, _CLOSE_KIND = 1, 2, 3  # token kinds while the shape is grown


def _values(kind: torch.Tensor, operator: torch.Tensor, digit: torch.Tensor, max_depth: int) -> torch.Tensor:
    """The value ``(n,)`` of each row's expression, evaluated level by level from the deepest (vectorised).

    The rules of ``listops.evaluate``: ``MIN``, ``MAX``, ``MED`` (the floor of the mean of the middle
    pair for an even count), ``SM`` (sum mod 10); the tests hold the two to agreement.

    ``kind (n, L)``: token kinds; ``operator``, ``digit (n, L)``: the operator index (into
    ``OPERATORS``) or digit drawn at each position (read where the kind says). A child at nesting
    level ``d`` belongs to the latest operator opened at level ``d - 1`` before it.
    """
    n, length = kind.shape
    opens, closes = (kind == _OPEN).long(), (kind == _CLOSE_KIND).long()
    level = (opens.cumsum(1) - closes.cumsum(1) - opens).view(-1)  # brackets open before each token (root: 0)
    kind, operator, value = kind.view(-1), operator.view(-1), digit.view(-1).clone()
    is_open = kind == _OPEN
    is_child = is_open | (kind == _DIGIT)
    for d in range(max_depth - 1, 0, -1):
        parents = (is_open & (level == d - 1)).nonzero().view(-1)  # flat positions, ascending
        if len(parents) == 0:
            continue
        children = (is_child & (level == d)).nonzero().view(-1)
        # a child's parent is the last parent before it (in its own row, as every row starts with its root)
        rank = torch.searchsorted(parents, children, right=True) - 1
        what = value[children]
        count = torch.bincount(rank, minlength=len(parents))
        low = torch.full((len(parents),), 10).scatter_reduce(0, rank, what, "amin")
        high = torch.zeros(len(parents), dtype=torch.long).scatter_reduce(0, rank, what, "amax")
        total = torch.zeros(len(parents), dtype=torch.long).scatter_add(0, rank, what) % 10
        ordered = (rank * 10 + what).sort().values % 10  # children grouped by parent, ascending values
        first = count.cumsum(0) - count
        median = (ordered[first + (count - 1) // 2] + ordered[first + count // 2]) // 2
        by_operator = torch.stack([low, high, median, total], 1)  # the order of OPERATORS
        value[parents] = by_operator.gather(1, operator[parents].view(-1, 1)).view(-1)
    return value.view(n, length)[:, 0]


def _uniforms(generator: torch.Generator | None):
    """``draw()``: the next float in [0, 1) of a stream drawn from ``generator`` in blocks (cheap per call)."""
    def blocks():
        while True:
            yield from torch.rand(1 << 16, generator=generator, dtype=torch.float64).tolist()
    return blocks().__next__


@register
@dataclass(frozen=True)
class LongListOps(Task):
    """The value (0-9) of one long nested MIN/MAX/MED/SUM_MOD expression, padded to ``length`` tokens.

    Nangia & Bowman 2018, "ListOps: A Diagnostic Dataset for Latent Tree Learning", NAACL SRW,
    arXiv:1804.06028; the long version is Long Range Arena's first task (Tay et al. 2021,
    arXiv:2011.04006, Sec. 3.1: depth up to 10, up to 10 arguments, 500-2000 tokens). Operators
    and tokens are those of the ``listops`` task (``[MIN [MAX [MED [SM`` and ``]``; ``MED`` of an
    even count is the floor of the mean of the middle pair, ``SM`` the sum mod 10; ids: pad 0,
    digits 1..10, operators 11..14, ``]`` 15).

    What it tests: hierarchical reasoning over a whole long sequence. Why it needs long range:
    the root operator is the first token and its last argument closes at the end; every digit
    can change the value through the nesting, so a window of the last tokens (or a count of
    tokens, which forgets the nesting) does not decide it.

    Generator: a target size ``T`` is drawn uniformly in ``[min_fraction length, length]``, then
    the tree is grown top-down to exactly ``T`` tokens: a node of size 1 is a digit; a node of
    size ``b >= 4`` is an operator whose ``b - 2`` inner tokens are split among 2..``max_args``
    children (digits and subtrees of size >= 4, in random order), no operator below depth
    ``max_depth - 1`` (root depth 1, as LRA). Drawing the size first replaces LRA's rejection
    on the length, which would cost many discarded trees per kept one.

    Differences from LRA: the split of sizes among children replaces LRA's branching process
    (the probability 0.25 of an operator), so the shape of the trees differs; labels keep their
    natural (uneven) spread: ``MIN`` roots lean to 0, ``MAX`` roots to 9.

    Shapes:
        ``inputs (n, length)`` long, padded with 0; ``lengths (n,)``; ``targets (n,)`` in 0..9.

    Complexity: ``O(n length / max_args)`` Python steps per batch (one per operator, to grow the
    shape; no rejection); digits, operators and values are drawn and evaluated vectorised.

    Args:
        length: padded sequence length (and the longest expression), >= 4.
        min_fraction: shortest expression as a fraction of ``length``, in (0, 1].
        max_depth: operators at depths ``1 .. max_depth - 1`` (>= 2).
        max_args: most arguments per operator (>= 4).

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> from attnkit.lab.tasks.listops import evaluate
        >>> task = tasks.get("long_listops", length=256)
        >>> batch = task.sample(4, generator=torch.Generator().manual_seed(0))
        >>> batch["inputs"].shape, bool((batch["lengths"] >= 128).all())
        (torch.Size([4, 256]), True)
        >>> [evaluate(task.decode(row)) for row in batch["inputs"]] == batch["targets"].tolist()
        True
    """

    name: ClassVar[str] = "long_listops"
    kind: ClassVar[str] = "classify"
    vocab_size: ClassVar[int] = len(TOKENS)

    length: int = 1024
    min_fraction: float = 0.5
    max_depth: int = 10
    max_args: int = 10

    def __post_init__(self):
        check_int("LongListOps", "length", self.length, 4, " (the shortest expression, [MIN d d ], has 4 tokens)")
        check_float("LongListOps", "min_fraction", self.min_fraction, 0.0, 1.0)
        if self.min_fraction == 0.0:
            raise ArgumentError(f"LongListOps: min_fraction must be a number in (0, 1]; got {self.min_fraction!r}")
        check_int("LongListOps", "max_depth", self.max_depth, 2)
        check_int("LongListOps", "max_args", self.max_args, 4, " (fewer cannot fill every size of expression)")
        if self._capacity(1) < self.length:
            raise ArgumentError(f"LongListOps: length must be <= {self._capacity(1)}, the longest expression of "
                                f"max_depth {self.max_depth} and max_args {self.max_args}; got {self.length}")
        object.__setattr__(self, "_capacities", tuple(self._capacity(d) for d in range(self.max_depth + 2)))
        bundles = tuple([_OPEN] + [_DIGIT] * k + [_CLOSE_KIND] for k in range(self.max_args + 1))
        object.__setattr__(self, "_bundles", bundles)  # the kinds of an operator over k digits

    @property
    def num_classes(self) -> int:
        return 10

    @property
    def min_length(self) -> int:
        """Fewest tokens of an expression: ``ceil(min_fraction length)``, at least 4."""
        return max(4, math.ceil(self.min_fraction * self.length))

    def _capacity(self, depth: int) -> int:
        """Most tokens a subtree rooted at ``depth`` can hold."""
        size = 1
        for _ in range(max(0, self.max_depth - depth)):
            size = 2 + self.max_args * size
        return size

    def _split(self, draw, inner: int, cap: int) -> list[int]:
        """Sizes of the children of an operator with ``inner`` tokens between its brackets.

        Each child is a digit (size 1) or a subtree of size ``4 .. cap``, at least one a subtree; there
        are ``2 .. max_args`` children. ``draw()`` is uniform in [0, 1).
        """
        most = self.max_args
        # subtrees s and digits d: 4 s + d <= inner <= cap s + d, 2 <= s + d <= max_args
        s_low = max(1 if inner >= 5 else 2, -(-(inner - most) // (cap - 1)))
        s_high = min(most, inner // 4)
        subtrees = s_low + int(draw() * (s_high - s_low + 1))
        d_low = max(0, 2 - subtrees, inner - cap * subtrees)
        d_high = min(most - subtrees, inner - 4 * subtrees)
        digits = d_low + int(draw() * (d_high - d_low + 1))
        extra = inner - digits - 4 * subtrees  # spread over the subtrees, none past its cap
        if subtrees == 1:
            sizes = [4 + extra]
        else:
            cuts = sorted([int(draw() * (extra + 1)) for _ in range(subtrees - 1)])
            sizes = [4 + b - a for a, b in zip([0, *cuts], [*cuts, extra], strict=True)]
        overflow = sum(max(0, size - cap) for size in sizes) if extra + 4 > cap else 0
        if overflow:
            sizes = [min(size, cap) for size in sizes]
            for i in range(subtrees):
                room = min(cap - sizes[i], overflow)
                sizes[i] += room
                overflow -= room
        children = sizes + [1] * digits
        for i in range(len(children) - 1, 0, -1):  # Fisher-Yates
            j = int(draw() * (i + 1))
            children[i], children[j] = children[j], children[i]
        return children

    def _shape(self, draw, out: list[int], size: int, depth: int) -> None:
        """Append the token kinds (``_OPEN``, ``_DIGIT``, ``_CLOSE``) of an operator subtree of ``size >= 4``."""
        inner = size - 2
        cap = self._capacities[depth + 1]
        if inner <= self.max_args and (cap == 1 or inner < 5 or draw() < 0.5):  # all digits: the common case
            out.extend(self._bundles[inner])
            return
        out.append(_OPEN)
        for child in self._split(draw, inner, cap):
            if child == 1:
                out.append(_DIGIT)
            else:
                self._shape(draw, out, child, depth + 1)
        out.append(_CLOSE_KIND)

    def _sample(self, n, generator):
        draw = _uniforms(generator)
        low, high, length = self.min_length, self.length, self.length
        kinds: list[int] = []
        lengths = []
        for _ in range(n):
            size = low + int(draw() * (high - low + 1))
            self._shape(draw, kinds, size, 1)
            kinds.extend([0] * (length - size))  # padding
            lengths.append(size)
        kind = torch.frombuffer(bytearray(kinds), dtype=torch.uint8).long().view(n, length)
        operator = torch.randint(0, 4, (n, length), generator=generator)
        digit = torch.randint(0, 10, (n, length), generator=generator)
        inputs = torch.zeros(n, length, dtype=torch.long)
        inputs = torch.where(kind == _OPEN, torch.tensor(_OPERATOR_IDS)[operator], inputs)
        inputs = torch.where(kind == _DIGIT, digit + 1, inputs)  # digit d has id d + 1
        inputs = torch.where(kind == _CLOSE_KIND, _CLOSE, inputs)
        targets = _values(kind, operator, digit, self.max_depth)
        return {"inputs": inputs, "lengths": torch.tensor(lengths), "targets": targets}

    def decode(self, ids) -> str:
        """The expression text of a row of ``inputs`` (padding dropped)."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return " ".join(TOKENS[i] for i in ids if i != 0)

    def describe(self) -> str:
        return (f"long_listops: ListOps value of one expression of {self.min_length}-"
                f"{self.length} tokens, depth < {self.max_depth}, <= {self.max_args} args, vocab {self.vocab_size} "
                f"(classify, 10 classes)")
