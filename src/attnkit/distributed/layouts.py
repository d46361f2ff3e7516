"""Which positions of a sequence each rank holds, and ``shard``/``gather`` between the full tensor and the shards.

The sequence of length L is cut into equal chunks; rank r of W holds::

    contiguous   W chunks of L/W      rank r: chunk r                   (positions [r L/W, (r+1) L/W))
    zigzag       2W chunks of L/(2W)  rank r: chunk r, then chunk 2W-1-r

Under a causal mask the contiguous layout leaves the last rank with W times the
work of the first; zigzag pairs an early chunk with a late one, so every rank
does the same work (Brandon et al. 2023, arXiv:2311.09431, the "striped" idea in
chunk form). A shard is its chunks concatenated in that order.
"""

from __future__ import annotations

import torch

from ..errors import ArgumentError, DTypeError, ShapeError
from .agreement import Field, checked, size
from .comm import Comm

__all__ = ["LAYOUTS", "num_chunks", "chunks_of", "shard", "gather"]

LAYOUTS = ("contiguous", "zigzag")


def check_layout(layout: str) -> str:
    if layout not in LAYOUTS:
        raise ArgumentError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    return layout


def num_chunks(layout: str, world: int) -> int:
    """How many chunks the sequence is cut into."""
    return world if check_layout(layout) == "contiguous" else 2 * world


def chunks_of(layout: str, rank: int, world: int) -> tuple[int, ...]:
    """The global chunk ids rank ``rank`` holds, in the order its shard stores them."""
    return (rank,) if check_layout(layout) == "contiguous" else (rank, 2 * world - 1 - rank)


def chunk_size(length: int, layout: str, world: int, name: str = "length") -> int:
    """``length / num_chunks``, or a :class:`ShapeError` when it does not divide."""
    n = num_chunks(layout, world)
    if length % n:
        raise ShapeError(f"{name} {length} must be divisible by {n} ({'W' if n == world else '2W'} for the "
                         f"{layout} layout over W={world} ranks)")
    return length // n


def shard(x: torch.Tensor, *, dim: int = -2, layout: str = "contiguous", group=None) -> torch.Tensor:
    """This rank's shard of a full tensor ``x`` along ``dim`` (any dtype; differentiable as slicing).

    Example (one process: the shard is the whole tensor)::

        x_local = attnkit.distributed.shard(x, dim=-2, layout="zigzag")
    """
    comm = Comm(group)
    c = chunk_size(x.shape[dim], layout, comm.world, f"x.shape[{dim}]")
    return torch.cat([x.narrow(dim, i * c, c) for i in chunks_of(layout, comm.rank, comm.world)], dim)


def gather(x: torch.Tensor, *, dim: int = -2, layout: str = "contiguous", group=None) -> torch.Tensor:
    """The full tensor on every rank from the shards ``x`` (differentiable: the gradient is reduce-scattered).

    Every rank must pass a shard of the same shape and dtype, with the same ``dim`` and ``layout``:
    one small all-gather checks that first (:mod:`.agreement`).
    """
    comm = Comm(group)
    shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
    checked(comm, "attnkit.distributed.gather",
            lambda: chunk_size(x.shape[dim] * comm.world, layout, comm.world, f"the gathered x.shape[{dim}]"), [
        Field(f"the shard length x.shape[{dim}]", size(x, dim), ShapeError),
        Field("the shape of x", str(shape), ShapeError), Field("x.dtype", str(getattr(x, "dtype", None)), DTypeError),
        Field("dim", repr(dim)), Field("layout", repr(layout))], device=getattr(x, "device", None))
    return gathered(x, dim, layout, comm)


def gathered(x: torch.Tensor, dim: int, layout: str, comm: Comm) -> torch.Tensor:
    """:func:`gather` once every rank has agreed on the call (no check here)."""
    if x.dtype == torch.bool:  # collectives move numbers; a bool travels as uint8
        return _Gather.apply(x.to(torch.uint8), dim, layout, comm).bool()
    return _Gather.apply(x, dim, layout, comm)


def _chunk_order(layout: str, world: int) -> list[tuple[int, int]]:
    """For every global chunk id in order, ``(rank, index within that rank's shard)``."""
    where = {c: (r, i) for r in range(world) for i, c in enumerate(chunks_of(layout, r, world))}
    return [where[c] for c in range(num_chunks(layout, world))]


def assemble(shards: list[torch.Tensor], dim: int, layout: str) -> torch.Tensor:
    """The full tensor from every rank's shard (in rank order)."""
    world = len(shards)
    per = len(chunks_of(layout, 0, world))
    pieces = [s.chunk(per, dim) for s in shards]
    return torch.cat([pieces[r][i] for r, i in _chunk_order(layout, world)], dim)


def split(full: torch.Tensor, dim: int, layout: str, world: int) -> list[torch.Tensor]:
    """Every rank's shard of ``full`` (in rank order): the inverse of :func:`assemble`."""
    c = full.shape[dim] // num_chunks(layout, world)
    return [torch.cat([full.narrow(dim, i * c, c) for i in chunks_of(layout, r, world)], dim) for r in range(world)]


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, layout, comm):
        ctx.dim, ctx.layout, ctx.comm = dim, layout, comm
        return assemble(comm.all_gather(x), dim, layout)

    @staticmethod
    def backward(ctx, grad):
        comm = ctx.comm
        return comm.reduce_scatter(split(grad, ctx.dim, ctx.layout, comm.world)), None, None, None
