"""USP, 2-D sequence parallelism: Ulysses across one axis of a mesh of ranks, the ring across the other.

Fang & Zhao 2024, "USP: A Unified Sequence Parallelism Approach for Long Context
Generative AI" (arXiv:2405.07719, Sec. 3). Ulysses alone needs the heads divisible by the
ranks and moves every head; the ring alone sends ``W - 1`` blocks. USP arranges the
``W = U x R`` ranks of the group as a mesh, group rank ``r = j U + u``::

    Ulysses groups  {j U, ..., j U + U - 1}      (U ranks: one all-to-all each way)
    ring groups     {u, U + u, ..., (R - 1) U + u}  (R ranks: the ring)

1. Within its Ulysses group, an all-to-all turns each rank's sequence shard into heads
   ``[u H/U, (u+1) H/U)`` of the group's positions. Those positions are exactly ring rank
   j's shard under the same layout over R ranks (contiguous: chunk j of R; zigzag: chunks
   j and 2R-1-j of 2R, each the union of the group's W-chunks), so
2. the ring (:mod:`.ring`) runs across the ring group on those heads, the mask and bias
   read at global head ``h + u H/U`` (:func:`attnkit.masks.shifted`), and
3. a second all-to-all returns the output (and the lse) to sequence shards.

U divides the query heads; K/V heads that U does not divide are repeated
``U / gcd(H_kv, U)`` times (as :mod:`.ulysses` does), so sequence parallelism works when
the K/V heads are fewer than the ranks: the default ``U = gcd(H_kv, W)`` repeats none.
The backward is the same collectives reversed (the reshards' and the ring's own).

Bytes sent per rank and call: Ulysses' formula over U ranks and ``L/R`` positions, plus the
ring's over R ranks with ``H_kv' / U`` K/V heads (``H_kv'`` repeated to a multiple of U).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.distributed as dist

from ..errors import ShapeError
from ..functional.shifted import shift_modifier
from ..masks import shifted
from . import ring, ulysses
from .blocks import Setting, as_rows, chunk_maps
from .comm import Comm
from .layouts import chunk_size

__all__ = ["ulysses_size", "mesh", "ring_setting", "usp_attention", "bytes_sent", "ring_sends"]

_GROUPS: dict = {}  # (the parent group's global ranks, U) -> (Ulysses group, ring group) of this process


def ulysses_size(heads: int, kv_heads: int, world: int, asked: int | None = None) -> int:
    """U, the ranks of a Ulysses group: ``asked``, checked, or ``gcd(H_kv, W)`` (no K/V head repeated)."""
    size = math.gcd(kv_heads, world) if asked is None else asked
    if not isinstance(size, int) or size < 1 or world % size or heads % size:
        raise ShapeError(f"scheme='usp' needs ulysses_size dividing the world size and the query heads: "
                         f"ulysses_size={size!r}, world size={world}, heads={heads}")
    return size


def mesh(comm: Comm, size: int) -> tuple[Comm, Comm]:
    """``(Ulysses comm, ring comm)`` of this rank; the two subgroups are made once per group and size.

    Each rank makes only the two groups it belongs to (local synchronisation), so the
    ranks of other groups of the world need not take part.
    """
    members = tuple(comm.global_rank(r) for r in range(comm.world))
    key = (members, size)
    if key not in _GROUPS:
        j, u = divmod(comm.rank, size)
        heads = dist.new_group([members[j * size + i] for i in range(size)], use_local_synchronization=True)
        ring_ranks = [members[i * size + u] for i in range(comm.world // size)]
        _GROUPS[key] = (heads, dist.new_group(ring_ranks, use_local_synchronization=True))
    heads, ring_group = _GROUPS[key]
    return Comm(heads), Comm(ring_group)


def ring_setting(s: Setting, *, h0: int, local_heads: int, world: int, layout: str, batch: int, heads: int,
                 device) -> Setting:
    """The setting of the ring stage: chunks over ``world`` ring ranks, mask and bias read at global heads
    ``[h0, h0 + local_heads)`` of ``heads`` (the chunk plan stays the one of all heads: the same on every rank)."""
    chunk = chunk_size(s.length, layout, world)
    active, full = chunk_maps(s.mask, s.length, chunk, batch, heads, device)
    mask = shifted(s.mask, h0=h0, q_len=s.length, kv_len=s.length)
    if isinstance(s.bias, torch.Tensor):
        bias = s.bias[:, h0:h0 + local_heads] if s.bias.shape[1] > 1 else s.bias
    else:
        bias = shift_modifier(s.bias, h0=h0, q_len=s.length, kv_len=s.length)
    return dataclasses.replace(s, mask=mask, bias=bias, chunk=chunk, active=as_rows(active), full=as_rows(full),
                               active_map=active, full_map=full)


def _stage(comm: Comm, setting: Setting, layout: str, size: int, batch: int, heads: int, device):
    """``(Ulysses comm, ring comm, the ring stage's setting)`` of this rank on the mesh."""
    heads_comm, ring_comm = mesh(comm, size)
    stage = ring_setting(setting, h0=heads_comm.rank * (heads // size), local_heads=heads // size,
                         world=ring_comm.world, layout=layout, batch=batch, heads=heads, device=device)
    return heads_comm, ring_comm, stage


def usp_attention(q, k, v, setting: Setting, comm: Comm, layout: str, size: int, with_lse: bool = True):
    """``(out, lse)`` of this rank's queries: Ulysses over ``size`` ranks, then the ring over the rest."""
    if size == comm.world:
        return ulysses.ulysses_attention(q, k, v, setting, comm, layout, with_lse)
    if size == 1:
        return ring.ring_attention(q, k, v, setting, comm, layout)
    heads_comm, ring_comm, stage = _stage(comm, setting, layout, size, q.shape[0], q.shape[1], q.device)
    g = ulysses.kv_repeat(k.shape[1], size)
    if g > 1:
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    q, k, v = ulysses._Reshard.apply(True, heads_comm, layout, q, k, v)  # (B, H/U, L/R, D)
    out, lse = ring.ring_attention(q, k, v, stage, ring_comm, layout)
    if not with_lse:
        return ulysses._Reshard.apply(False, heads_comm, layout, out)[0], None
    out, lse = ulysses._Reshard.apply(False, heads_comm, layout, out, lse.unsqueeze(-1))
    return out, lse.squeeze(-1)


def bytes_sent(*, batch, heads, kv_heads, length, head_dim, value_dim, world, size, itemsize, lse_itemsize=0,
               ring_sends=None, grad_itemsize=None, backward=False) -> int:
    """Bytes one rank sends in one call: the two reshards over ``size`` ranks and the ring over the others.

    ``ring_sends``: the ring stage's ``RingPlan.sends()`` (None: no mask, ``(R - 1, R)``).
    """
    rows = world // size
    reshard = ulysses.bytes_sent(batch=batch, heads=heads, kv_heads=kv_heads, length=length // rows,
                                 head_dim=head_dim, value_dim=value_dim, world=size, itemsize=itemsize,
                                 lse_itemsize=lse_itemsize)  # 0 for size 1: no reshard
    if rows == 1:  # Ulysses over every rank: no ring
        return reshard
    kv_stage = kv_heads * ulysses.kv_repeat(kv_heads, size) // size
    return reshard + ring.bytes_sent(batch=batch, kv_heads=kv_stage, length=length, head_dim=head_dim,
                                     value_dim=value_dim, world=rows, itemsize=itemsize, grad_itemsize=grad_itemsize,
                                     sends=ring_sends, backward=backward)


def ring_sends(comm: Comm, setting: Setting, layout: str, batch: int, heads: int, device) -> tuple[int, int] | None:
    """The ring stage's ``RingPlan.sends()`` on this rank (None when there is no ring stage)."""
    size = setting.ulysses_size
    if size == comm.world:
        return None
    if size == 1:
        return ring.RingPlan(comm, setting, layout).sends()
    _, ring_comm, stage = _stage(comm, setting, layout, size, batch, heads, device)
    return ring.RingPlan(ring_comm, stage, layout).sends()
