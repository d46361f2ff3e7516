"""Every rank of a group checks, before any data moves, that all ranks are making the same call.

The collectives of a scheme only work when every rank takes part with tensors of the
same sizes and the same plan: shards of different lengths, heads, head dims or dtypes
end inside gloo or NCCL with a crash, and two ranks that read different masks derive
different ring schedules and wait for each other until the group's timeout (30 minutes
by default). So each call first all-gathers one small fixed-size description of itself
(:data:`SLOTS` int64 numbers: which function, whether this rank's own checks passed, the
sizes, and a CRC-32 of every option's text) and compares them; where they differ, every
rank raises the same attnkit error, naming each field that differs and which rank holds
which value. A rank whose own checks failed raises its own error; the others say which
rank failed. Because the description names the function, ranks that call different
functions (one gathers a keep mask, another does not) are caught the same way.

Cost: one all-gather of ``SLOTS * 8`` bytes per call, counted as ``"agreement"``
(:func:`bytes_sent`).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable

import torch

from ..errors import ArgumentError, DTypeError, ShapeError
from .comm import Comm

__all__ = ["SLOTS", "Field", "agree", "checked", "bytes_sent", "size", "text_of", "tracked", "layer_fields"]

SLOTS = 24  # the call, whether this rank's own checks passed, and up to 22 fields


class Field:
    """One thing every rank must agree on: a ``label`` for messages, a ``value`` (an int, compared as it is,
    or a str, compared by its CRC-32) and the error class raised when the ranks differ."""

    def __init__(self, label: str, value, error: type[Exception] = ArgumentError):
        self.label, self.value, self.error = label, value, error

    def number(self) -> int:
        return self.value if isinstance(self.value, int) else zlib.crc32(str(self.value).encode())


def text_of(value) -> str:
    """A description of an option that is the same in every process (no memory addresses)."""
    if value is None:
        return "None"
    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)} {value.dtype}"
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))  # a function's repr names it, then its address


def size(t, dim: int) -> int:
    """``t.shape[dim]``, or -1 where ``t`` has no such dim (a rank whose own checks failed still reports)."""
    return int(t.shape[dim]) if isinstance(t, torch.Tensor) and -t.dim() <= dim < t.dim() else -1


def tracked(*tensors) -> Field:
    """Whether autograd records this call: the backward is collective, so every rank's call or none."""
    on = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)
    return Field("whether gradients are tracked (the backward is collective)", int(on))


def layer_fields(layer, x, key_keep_mask, layout: str) -> list[Field]:
    """What the ranks of a sequence-parallel call of a ``layer`` on shards ``x`` ``(b, L/W, dim)`` agree on."""
    params = layer.parameters() if isinstance(layer, torch.nn.Module) else ()
    return [Field("the shard length (x.shape[1])", size(x, 1), ShapeError),
            Field("the shape of x", str(tuple(getattr(x, "shape", ()))), ShapeError),
            Field("x.dtype", text_of(getattr(x, "dtype", None)), DTypeError), Field("layer", text_of(layer)),
            Field("whether a key_keep_mask is given", int(key_keep_mask is not None)), Field("layout", repr(layout)),
            tracked(x, *params)]


def bytes_sent(world: int) -> int:
    """Bytes one rank sends for one agreement check."""
    return (world - 1) * SLOTS * 8


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}"


def _by_value(column: list[int]) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for rank, value in enumerate(column):
        groups.setdefault(value, []).append(rank)
    return groups


def _difference(field: Field, column: list[int], rank: int) -> str:
    groups = _by_value(column)
    if isinstance(field.value, int):
        return f"{field.label}: " + "; ".join(f"{value} on {_ranks(r)}" for value, r in groups.items())
    others = [r for value, group in groups.items() if value != column[rank] for r in group]
    text = str(field.value)
    text = text if len(text) <= 160 else text[:159] + "…"  # a mask holding data can print at length
    return f"{field.label}: {text} on {_ranks(groups[column[rank]])}, another on {_ranks(sorted(others))}"


def agree(comm: Comm, who: str, fields: list[Field], failure: BaseException | None = None,
          device=None) -> None:
    """Raise on every rank unless every rank of ``comm``'s group called ``who`` with the same ``fields``.

    ``failure`` is this rank's own error from its checks, if any: it is raised here, after
    the exchange, so that the other ranks learn of it instead of waiting for this one.
    """
    if len(fields) > SLOTS - 2:
        raise ArgumentError(f"agree: at most {SLOTS - 2} fields; got {len(fields)}")
    numbers = [zlib.crc32(who.encode()), int(failure is not None)] + [f.number() for f in fields]
    mine = torch.tensor(numbers + [0] * (SLOTS - len(numbers)), dtype=torch.int64, device=device)
    table = torch.stack(comm.all_gather(mine, kind="agreement")).tolist()  # (W, SLOTS)
    columns = list(zip(*table, strict=True))
    if len(set(columns[0])) > 1:
        same = _by_value(list(columns[0]))[numbers[0]]
        raise ArgumentError(f"{who}: the ranks are not making the same call: {_ranks(same)} called {who}, "
                            f"{_ranks([r for r in range(len(table)) if r not in same])} something else (every rank "
                            "must make the same calls in the same order)")
    if failure is not None:
        raise failure
    failed = [r for r, flag in enumerate(columns[1]) if flag]
    if failed:
        raise ArgumentError(f"{who}: {_ranks(failed)} refused the call (the error there says why); this rank's "
                            "call was valid")
    differ = [(f, list(col)) for f, col in zip(fields, columns[2:], strict=False) if len(set(col)) > 1]
    if differ:
        lines = "; ".join(_difference(f, col, comm.rank) for f, col in differ)
        raise differ[0][0].error(f"{who}: the ranks disagree on {lines} (every rank must pass its shard of "
                                 f"one global problem, with the same options); seen from rank {comm.rank}")


def checked(comm: Comm, who: str, check: Callable, fields, device=None):
    """Run this rank's own ``check()`` (no communication), then :func:`agree` on ``fields``; ``check()``'s answer.

    ``fields`` is a list of :class:`Field`, or a function of ``check()``'s answer (None where it
    raised) returning one. An error of ``check()`` is raised by :func:`agree`, after the exchange.
    """
    answer = failure = None
    try:
        answer = check()
    except Exception as err:  # raised by agree(), once the other ranks have heard of it
        failure = err
    agree(comm, who, fields(answer) if callable(fields) else fields, failure, device)
    return answer
