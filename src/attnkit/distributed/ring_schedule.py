"""The ring's schedule: which rank needs which K/V block, and how far each block travels each way.

Every rank derives the same schedule from the chunk plan (:mod:`.blocks`), so sender and
receiver agree on every transfer without talking about it. Block ``src`` travels only as
far as the farthest rank that needs it, forward (to src + 1, src + 2, ...) and, where that
is shorter, also backward as a second lane (:func:`split_hops`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .blocks import Setting
from .comm import Comm
from .layouts import chunks_of

__all__ = ["Lane", "RingSchedule", "split_hops", "rank_needs"]


class Lane(NamedTuple):
    """One direction of travel: blocks move to ``rank + direction``; ``hops[src]``: how far block src goes."""

    direction: int
    hops: list
    tag: int


def split_hops(needs, world: int) -> tuple[list, list]:
    """Per source block, how far it travels forward (to rank + 1, ...) and backward (to rank - 1, ...).

    The split reaches every rank that needs the block in the fewest hops, preferring
    forward (the plain ring) on ties; a window reaching both sides goes one hop each way.
    With the ranks that need block src at offsets ``0 = o_0 < o_1 < ... < o_m < o_{m+1} = W``
    (rank ``src + o``), a split after ``o_i`` costs ``o_i`` hops forward plus ``W - o_{i+1}``
    backward; all splits of all blocks are compared at once (``needs[dst][src]``, W x W).
    """
    needs = torch.as_tensor(needs, dtype=torch.bool)
    src, t = torch.arange(world)[:, None], torch.arange(world)[None, :]
    reach = needs[(src + t) % world, src]  # (src, t): rank src + t needs block src
    reach[:, 0] = True  # o_0: the split that sends nothing forward
    offsets = torch.where(reach, t, world)
    tail = torch.cat([offsets[:, 1:], torch.full((world, 1), world)], 1)
    after = tail.flip(1).cummin(1).values.flip(1)  # the next offset after t (W: none)
    hops = torch.where(reach, t + world - after, 3 * world)
    best = (hops * world - t).argmin(1)  # fewest hops; on ties the largest t (most forward)
    return best.tolist(), (world - after.gather(1, best[:, None])[:, 0]).tolist()


def rank_needs(active: torch.Tensor, layout: str, world: int) -> list:
    """``needs[dst, src]`` (W x W bool): some query chunk of rank dst may see some key chunk of rank src."""
    order = [c for r in range(world) for c in chunks_of(layout, r, world)]  # chunk ids, rank by rank
    per = len(order) // world
    by_rank = active[order][:, order].view(world, per, world, per)
    return by_rank.any(3).any(1)


class RingSchedule:
    """Who needs which block and how far each block travels each way, seen from this rank."""

    def __init__(self, comm: Comm, setting: Setting, layout: str):
        self.comm, self.s, self.layout = comm, setting, layout
        w, r = comm.world, comm.rank
        self.q_chunks = chunks_of(layout, r, w)
        needs = rank_needs(setting.active_map, layout, w)
        forward, backward = split_hops(needs, w)
        self.needs = needs.tolist()
        self.lanes = [Lane(1, forward, 0)] + ([Lane(-1, backward, 3)] if any(backward) else [])

    # ------------------------------------------------------------- the schedule
    def source(self, lane: Lane, rank: int, step: int) -> int:
        return (rank - lane.direction * step) % self.comm.world

    def holds(self, lane: Lane, rank: int, step: int) -> bool:
        return step <= lane.hops[self.source(lane, rank, step)]

    def forwards(self, lane: Lane, rank: int, step: int) -> bool:
        """Rank ``rank`` passes its block of this step on to ``rank + lane.direction``."""
        return step + 1 <= lane.hops[self.source(lane, rank, step)]

    def sends(self) -> tuple[int, int]:
        """``(K/V blocks, gradient accumulators)`` this rank sends in one pass (the accumulators in the backward)."""
        r, w = self.comm.rank, self.comm.world
        forward = sum(self.forwards(lane, r, s) for lane in self.lanes for s in range(w))
        home = sum(0 < s == lane.hops[self.source(lane, r, s)] for lane in self.lanes for s in range(w))
        return forward, forward + home  # the last holder of a block sends its accumulator home
