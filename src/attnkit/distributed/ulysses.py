"""DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv:2309.14509): all-to-all from sequence shards to head shards.

Each rank sends every other rank the heads that rank will own, for its own
positions; afterwards rank r holds heads ``[r H/W, (r+1) H/W)`` for the whole
sequence, runs one local ``attnkit.attention`` on them (the mask and modifier read
at global head ``h + r H/W``), and a second all-to-all brings the output (and lse)
back to sequence shards. The backward is the same two all-to-alls in reverse.

Heads: the query heads must be divisible by W. Grouped K/V heads ``H_kv`` that W
does not divide are repeated ``g = W / gcd(H_kv, W)`` times (g always divides the
group size ``H / H_kv``, so every query head keeps its K/V head); their gradients
are summed back by autograd.

Bytes sent per rank per call (itemsize s; ``f = (W - 1) / W``, the share bound
for other ranks)::

    forward   f * B * (L/W) * (H * D + H_kv' * (D + Dv) + H * Dv) * s   (+ f * B * H * (L/W) * 4|8 for lse)
    backward  the same (dout, and d lse when asked, in; dq, dk, dv back)
"""

from __future__ import annotations

import math

import torch

from ..errors import ShapeError
from .blocks import Setting, block_attention
from .comm import Comm
from .layouts import assemble, split

__all__ = ["ulysses_attention", "kv_repeat", "bytes_sent"]


def check_heads(heads: int, world: int) -> None:
    if heads % world:
        raise ShapeError(f"scheme='ulysses' needs the query heads divisible by the world size: "
                         f"heads={heads}, world size={world} (use scheme='ring' or 'allgather')")


def kv_repeat(kv_heads: int, world: int) -> int:
    """How many times each K/V head is repeated so that W divides the K/V heads."""
    return world // math.gcd(kv_heads, world)


class _Reshard(torch.autograd.Function):
    """Several tensors moved at once between sequence shards and head shards; the backward moves them back.

    One function for all of them, so that every rank runs the same collectives in its
    backward whichever of the outputs its loss uses (unused ones get zero gradients).
    """

    @staticmethod
    def forward(ctx, to_heads, comm, layout, *tensors):
        ctx.to_heads, ctx.comm, ctx.layout = to_heads, comm, layout
        move = seq_to_heads if to_heads else heads_to_seq
        return tuple(move(t, comm, layout) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        move = heads_to_seq if ctx.to_heads else seq_to_heads
        return (None, None, None, *(move(g, ctx.comm, ctx.layout) for g in grads))


def seq_to_heads(x, comm: Comm, layout: str):
    received = comm.all_to_all(list(x.chunk(comm.world, 1)))  # [j]: rank j's positions, our heads
    return assemble(received, -2, layout)


def heads_to_seq(x, comm: Comm, layout: str):
    received = comm.all_to_all(split(x, -2, layout, comm.world))  # [j]: our positions, rank j's heads
    return torch.cat(received, 1)


def ulysses_attention(q, k, v, setting: Setting, comm: Comm, layout: str, with_lse: bool = True):
    """``(out, lse)`` of this rank's queries, through head shards (lse None unless ``with_lse``)."""
    heads, world = q.shape[1], comm.world
    check_heads(heads, world)
    g = kv_repeat(k.shape[1], world)
    if g > 1:
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    q, k, v = _Reshard.apply(True, comm, layout, q, k, v)
    out, lse = block_attention(setting, q, k, v, q0=0, k0=0, h0=comm.rank * (heads // world))
    if not with_lse:
        return _Reshard.apply(False, comm, layout, out)[0], None
    out, lse = _Reshard.apply(False, comm, layout, out, lse.unsqueeze(-1))
    return out, lse.squeeze(-1)


def bytes_sent(*, batch, heads, kv_heads, length, head_dim, value_dim, world, itemsize, lse_itemsize=0) -> int:
    """Bytes one rank sends in the forward of one call, or in its backward (the same all-to-alls reversed).

    ``lse_itemsize`` is 0 when the lse is not asked for.
    """
    kv_heads *= kv_repeat(kv_heads, world)
    rows = batch * (length // world)
    forward = rows * (heads * head_dim + kv_heads * (head_dim + value_dim) + heads * value_dim) * itemsize
    forward += rows * heads * lse_itemsize
    return forward * (world - 1) // world
