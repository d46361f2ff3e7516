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

from . import agreement, allgather, ring, tree, ulysses, usp
from .api import plan
from .comm import Comm

__all__ = ["expected_bytes"]


def expected_bytes(q, k, v, *, mask=None, scheme="ring", layout="contiguous", group=None,
                   return_lse=False, ulysses_size=None) -> tuple[int, int]:
    """``(forward, backward)`` bytes this rank sends in one call with these shards."""
    comm = Comm(group)
    setting = plan(q, k, v, mask=mask, bias=None, scale=None, scheme=scheme, layout=layout, world=comm.world,
                   ulysses_size=ulysses_size)
    sizes = {"batch": q.shape[0], "kv_heads": k.shape[1], "length": setting.length, "head_dim": k.shape[-1],
             "value_dim": v.shape[-1], "world": comm.world, "itemsize": k.element_size()}
    check = agreement.bytes_sent(comm.world)
    if setting.length == 0:
        return check, 0
    lse_size = 8 if v.dtype == torch.float64 else 4  # lse and gradient accumulators: float32, float64 for float64
    if scheme == "ring":
        sends = ring.RingPlan(comm, setting, layout).sends()
        return (check + ring.bytes_sent(**sizes, sends=sends),
                ring.bytes_sent(**sizes, sends=sends, grad_itemsize=lse_size, backward=True))
    lse_itemsize = lse_size if return_lse else 0
    if scheme == "ulysses":
        both = ulysses.bytes_sent(**sizes, heads=q.shape[1], lse_itemsize=lse_itemsize)
        return check + both, both
    if scheme == "usp":
        sends = usp.ring_sends(comm, setting, layout, q.shape[0], q.shape[1], q.device)
        usp_sizes = {**sizes, "heads": q.shape[1], "size": setting.ulysses_size, "lse_itemsize": lse_itemsize,
                     "ring_sends": sends, "grad_itemsize": lse_size}
        return check + usp.bytes_sent(**usp_sizes), usp.bytes_sent(**usp_sizes, backward=True)
    if scheme == "tree":
        tree_sizes = {"batch": q.shape[0], "heads": q.shape[1], "q_len": q.shape[2], "value_dim": v.shape[-1],
                      "world": comm.world, "lse_itemsize": lse_size}
        return check + tree.bytes_sent(**tree_sizes), tree.bytes_sent(**tree_sizes, backward=True)
    both = allgather.bytes_sent(**sizes)
    return check + both, both
