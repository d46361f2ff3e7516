"""The collectives of the sequence-parallel schemes, relative to a process group, with their bytes counted.

Every tensor the schemes hand to ``torch.distributed`` goes through :class:`Comm`,
which counts what this rank puts on the wire (the same count under gloo and NCCL)::

    point-to-point send of t          t.nbytes
    all_to_all(inputs)                sum of inputs[j].nbytes, j != rank
    all_gather(t)                     (W - 1) * t.nbytes   (t reaches the W - 1 other ranks)
    reduce_scatter(inputs)            sum of inputs[j].nbytes, j != rank
    all_reduce(t)                     2 (W - 1) / W * t.nbytes   (a ring all-reduce)
    agreement check                   (W - 1) * 192              (an all-gather, see :mod:`.agreement`)

``with count_bytes() as tally:`` collects those counts per operation kind;
``tally.total`` is the bytes this rank sent. Ranks are relative to the group
(``rank``, ``world``); point-to-point peers are translated to global ranks here.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..errors import ArgumentError

__all__ = ["Comm", "Tally", "count_bytes"]

_TALLIES: list[Tally] = []


@dataclass
class Tally:
    """Bytes this rank sent, per operation kind (``send``, ``all_to_all``, ``all_gather``, ``reduce_scatter``, ...)."""

    by_kind: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())


@contextlib.contextmanager
def count_bytes():
    """Count the bytes the schemes send from this rank inside the block (nested blocks all count)."""
    tally = Tally()
    _TALLIES.append(tally)
    try:
        yield tally
    finally:
        _TALLIES.remove(tally)


def _record(kind: str, nbytes: int) -> None:
    for tally in _TALLIES:
        tally.by_kind[kind] += nbytes


class Comm:
    """One process group seen from this rank: its rank and size, and counted collectives."""

    def __init__(self, group=None):
        if not dist.is_available() or not dist.is_initialized():
            raise ArgumentError("attnkit.distributed needs an initialised torch.distributed process group "
                                "(torch.distributed.init_process_group)")
        self.group = group
        self.rank = dist.get_rank(group)
        if self.rank < 0:
            raise ArgumentError(f"this process (global rank {dist.get_rank()}) is not a member of the group it was "
                                "given")
        self.world = dist.get_world_size(group)

    def global_rank(self, rank: int) -> int:
        rank %= self.world
        return rank if self.group is None else dist.get_global_rank(self.group, rank)

    # ---------------------------------------------------------------- point to point
    def exchange(self, sends: list[tuple[torch.Tensor, int, int]], recvs: list[tuple[torch.Tensor, int, int]]):
        """Post sends ``(tensor, to_rank, tag)`` and receives ``(buffer, from_rank, tag)``; returns the requests.

        Nothing blocks: call :meth:`wait` on the answer after the work that overlaps them.
        """
        ops = [dist.P2POp(dist.isend, t, self.global_rank(peer), self.group, tag) for t, peer, tag in sends]
        ops += [dist.P2POp(dist.irecv, t, self.global_rank(peer), self.group, tag) for t, peer, tag in recvs]
        for t, _, _ in sends:
            _record("send", t.nbytes)
        return dist.batch_isend_irecv(ops) if ops else []

    @staticmethod
    def wait(requests) -> None:
        for request in requests:
            request.wait()

    # ---------------------------------------------------------------- collectives
    def all_to_all(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """``inputs[j]`` goes to rank j; answer ``[j]`` came from rank j (same shapes on every rank)."""
        inputs = [t.contiguous() for t in inputs]
        outputs = [torch.empty_like(t) for t in inputs]
        _record("all_to_all", sum(t.nbytes for j, t in enumerate(inputs) if j != self.rank))
        dist.all_to_all(outputs, inputs, group=self.group)
        return outputs

    def all_gather(self, t: torch.Tensor, kind: str = "all_gather") -> list[torch.Tensor]:
        """Every rank's ``t`` (same shape everywhere), in rank order; its bytes are counted under ``kind``."""
        t = t.contiguous()
        outputs = [torch.empty_like(t) for _ in range(self.world)]
        _record(kind, (self.world - 1) * t.nbytes)
        dist.all_gather(outputs, t, group=self.group)
        return outputs

    def all_reduce_max(self, t: torch.Tensor) -> torch.Tensor:
        """The elementwise max of ``t`` over ranks (a new tensor)."""
        return self._all_reduce(t, dist.ReduceOp.MAX)

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        """The elementwise sum of ``t`` over ranks (a new tensor)."""
        return self._all_reduce(t, dist.ReduceOp.SUM)

    def _all_reduce(self, t: torch.Tensor, op) -> torch.Tensor:
        t = t.contiguous().clone()
        _record("all_reduce", 2 * (self.world - 1) * t.nbytes // self.world)
        dist.all_reduce(t, op=op, group=self.group)
        return t

    def reduce_scatter(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        """The sum over ranks of their ``inputs[rank]``."""
        inputs = [t.contiguous() for t in inputs]
        out = torch.empty_like(inputs[self.rank])
        _record("reduce_scatter", sum(t.nbytes for j, t in enumerate(inputs) if j != self.rank))
        dist.reduce_scatter(out, inputs, group=self.group)
        return out
