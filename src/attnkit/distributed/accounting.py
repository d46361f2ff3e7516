"""The bytes a call sends from this rank, by formula: what ``count_bytes`` must measure.

``expected_bytes(q, k, v, scheme=..., ...)`` takes the same local shards and options as
:func:`attnkit.distributed.attention` and answers ``(forward, backward)`` bytes for this
rank from the schemes' formulas (:func:`.ring.bytes_sent`, :func:`.ulysses.bytes_sent`,
:func:`.allgather.bytes_sent`); for the ring with a mask, the sends are read off its plan.
The forward adds the agreement check every call starts with (:func:`.agreement.bytes_sent`).
It communicates nothing itself.
"""

from __future__ import annotations

import torch

from . import agreement, allgather, ring, ulysses
from .api import plan
from .comm import Comm

__all__ = ["expected_bytes"]


def expected_bytes(q, k, v, *, mask=None, scheme="ring", layout="contiguous", group=None,
                   return_lse=False) -> tuple[int, int]:
    """``(forward, backward)`` bytes this rank sends in one call with these shards."""
    comm = Comm(group)
    setting = plan(q, k, v, mask=mask, bias=None, scale=None, scheme=scheme, layout=layout, world=comm.world)
    sizes = {"batch": q.shape[0], "kv_heads": k.shape[1], "length": setting.length, "head_dim": k.shape[-1],
             "value_dim": v.shape[-1], "world": comm.world, "itemsize": k.element_size()}
    check = agreement.bytes_sent(comm.world)
    if setting.length == 0:
        return check, 0
    if scheme == "ring":
        sends = ring.RingPlan(comm, setting, layout).sends()
        grad_itemsize = 8 if v.dtype == torch.float64 else 4
        return (check + ring.bytes_sent(**sizes, sends=sends),
                ring.bytes_sent(**sizes, sends=sends, grad_itemsize=grad_itemsize, backward=True))
    if scheme == "ulysses":
        lse_itemsize = (8 if v.dtype == torch.float64 else 4) if return_lse else 0
        both = ulysses.bytes_sent(**sizes, heads=q.shape[1], lse_itemsize=lse_itemsize)
        return check + both, both
    both = allgather.bytes_sent(**sizes)
    return check + both, both
