"""ListOps-mini: nested list operations on digits, generated with the Long Range Arena rules."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import ArgumentError, check_int
from .base import Task, python_rng, register

__all__ = ["ListOps", "evaluate", "OPERATORS", "TOKENS"]

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
TOKENS = ("<pad>", *(str(d) for d in range(10)), *OPERATORS, "]")
_ID = {tok: i for i, tok in enumerate(TOKENS)}
_VALUE_P = 0.25  # LRA: probability that a node above max_depth is an operator


def _apply(op: str, args: list[int]) -> int:
    if op == "[MIN":
        return min(args)
    if op == "[MAX":
        return max(args)
    if op == "[SM":
        return sum(args) % 10
    ordered = sorted(args)  # [MED: LRA's int(np.median(args)), the floor of the mean of the middle pair
    return (ordered[(len(ordered) - 1) // 2] + ordered[len(ordered) // 2]) // 2


def evaluate(expression: str | list[str]) -> int:
    """The value of a ListOps expression such as ``"[MAX 2 9 [MIN 4 7 ] 0 ]"`` (-> 9).

    Operators: ``[MIN``, ``[MAX``, ``[MED`` (median; for an even count the floor of the mean
    of the two middle values, as LRA's ``int(np.median(...))``), ``[SM`` (sum mod 10).
    Raises ArgumentError naming ``expression`` when it is not well formed.
    """
    tokens = expression.split() if isinstance(expression, str) else list(expression)
    stack: list[tuple[str, list[int]]] = []
    result = None
    for tok in tokens:
        if result is not None:
            raise ArgumentError(f"listops.evaluate: expression has tokens after its end; got {expression!r}")
        if tok in OPERATORS:
            stack.append((tok, []))
            continue
        if tok == "]":
            if not stack or not stack[-1][1]:
                raise ArgumentError(f"listops.evaluate: expression has ']' without arguments; got {expression!r}")
            op, args = stack.pop()
            value = _apply(op, args)
        elif tok.isdigit() and len(tok) == 1:
            value = int(tok)
        else:
            raise ArgumentError(f"listops.evaluate: expression has unknown token {tok!r}; got {expression!r}")
        if stack:
            stack[-1][1].append(value)
        else:
            result = value
    if result is None or stack:
        raise ArgumentError(f"listops.evaluate: expression is empty or unclosed; got {expression!r}")
    return result


class _TooLong(Exception):
    pass


def _grow(rng, out: list[str], depth: int, max_depth: int, max_args: int, max_len: int) -> int:
    """Append one LRA-style subtree to ``out``; return its value. Raises _TooLong past ``max_len``."""
    if depth >= max_depth or rng.random() > _VALUE_P:
        value = rng.randrange(10)
        out.append(str(value))
    else:
        op = OPERATORS[rng.randrange(len(OPERATORS))]
        out.append(op)
        args = [_grow(rng, out, depth + 1, max_depth, max_args, max_len) for _ in range(rng.randint(2, max_args))]
        out.append("]")
        value = _apply(op, args)
    if len(out) > max_len:
        raise _TooLong
    return value


@register
@dataclass(frozen=True)
class ListOps(Task):
    """ListOps-mini: the value (0-9) of a nested MIN/MAX/MED/SUM_MOD expression over digits.

    Nangia & Bowman 2018, "ListOps: A Diagnostic Dataset for Latent Tree Learning", NAACL SRW,
    arXiv:1804.06028; generator rules of Long Range Arena, Tay et al. 2021, arXiv:2011.04006
    (``lra_benchmarks/data/listops.py``): a node at depth ``< max_depth`` (root depth 1) is an
    operator with probability 0.25, else a digit; an operator takes ``2 .. max_args``
    arguments; ``MED`` of an even count is ``floor((a + b) / 2)`` of the middle pair ``a <= b``
    (LRA's ``int(np.median(...))``); ``SM`` is the sum mod 10. Expressions are drawn until
    ``min_len <= length <= max_len`` tokens, as LRA's length filter.

    Tokens (one id each): ``<pad>`` 0, digits ``0..9`` -> 1..10, ``[MIN [MAX [MED [SM`` -> 11..14,
    ``]`` -> 15 (``TOKENS`` lists them). ``decode(ids)`` gives the text back.

    Differences from the paper: small sizes (LRA: depth 10, 10 arguments, 500-2000 tokens); the
    length bounds are inclusive (LRA's are strict); no parenthesis tokens; duplicates allowed.

    Shapes:
        ``inputs (n, max_len)`` padded with 0, ``lengths (n,)``, ``targets (n,)`` in 0..9.

    Complexity: ``O(n max_len)`` Python steps per batch (rejection sampling on the length).

    Args:
        max_depth: deepest level that can hold an operator is ``max_depth - 1`` (>= 2).
        max_args: most arguments per operator (>= 2).
        min_len, max_len: bounds on the expression length in tokens.

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> from attnkit.lab.tasks.listops import evaluate
        >>> evaluate("[MAX 2 9 [MIN 4 7 ] 0 ]"), evaluate("[MED 1 4 ]"), evaluate("[SM 8 [MAX 3 5 ] ]")
        (9, 2, 3)
        >>> task = tasks.get("listops", max_len=20)
        >>> batch = task.sample(3, generator=torch.Generator().manual_seed(0))
        >>> [evaluate(task.decode(row)) for row in batch["inputs"]] == batch["targets"].tolist()
        True
    """

    name: ClassVar[str] = "listops"
    kind: ClassVar[str] = "classify"
    vocab_size: ClassVar[int] = len(TOKENS)

    max_depth: int = 4
    max_args: int = 4
    min_len: int = 6
    max_len: int = 32

    def __post_init__(self):
        check_int("ListOps", "max_depth", self.max_depth, 2)
        check_int("ListOps", "max_args", self.max_args, 2)
        check_int("ListOps", "max_len", self.max_len, 4, " (the shortest expression, [MIN d d ], has 4 tokens)")
        check_int("ListOps", "min_len", self.min_len, 1)
        longest = 1
        for _ in range(self.max_depth - 1):
            longest = 2 + self.max_args * longest
        if self.min_len > min(self.max_len, longest):
            raise ArgumentError(f"ListOps: min_len must be <= max_len = {self.max_len} and <= {longest}, the "
                                f"longest expression of max_depth {self.max_depth}; got {self.min_len}")

    @property
    def num_classes(self) -> int:
        return 10

    def _expression(self, rng) -> tuple[list[str], int]:
        for _ in range(100_000):
            out: list[str] = []
            try:
                value = _grow(rng, out, 1, self.max_depth, self.max_args, self.max_len)
            except _TooLong:
                continue
            if len(out) >= self.min_len:
                return out, value
        raise ArgumentError(f"ListOps: no expression of min_len {self.min_len} .. max_len {self.max_len} tokens "
                            f"in 100000 draws; widen the bounds")

    def _sample(self, n, generator):
        rng = python_rng(generator)
        inputs = torch.zeros(n, self.max_len, dtype=torch.long)
        lengths, targets = [], []
        for i in range(n):
            tokens, value = self._expression(rng)
            inputs[i, :len(tokens)] = torch.tensor([_ID[t] for t in tokens])
            lengths.append(len(tokens))
            targets.append(value)
        return {"inputs": inputs, "lengths": torch.tensor(lengths), "targets": torch.tensor(targets)}

    def decode(self, ids) -> str:
        """The expression text of a row of ``inputs`` (padding dropped)."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        return " ".join(TOKENS[i] for i in ids if i != 0)

    def describe(self) -> str:
        return (f"listops: ListOps value of MIN/MAX/MED/SM expressions, depth < {self.max_depth}, <= {self.max_args} "
                f"args, {self.min_len}-{self.max_len} tokens, vocab {self.vocab_size} (classify, 10 classes)")
