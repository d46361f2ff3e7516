"""One block of the global problem, computed locally through ``attnkit.attention``; the chunk plan.

Every scheme cuts the global ``L x L`` scores into blocks (query chunk x key
chunk, or all positions of some heads) and computes each block with
``attnkit.attention(..., return_lse=True)`` on its shifted mask and modifier
(:func:`attnkit.masks.shifted`, :mod:`attnkit.functional.shifted`), so any of attnkit's kernels runs it.

The chunk plan is the mask's block layout at the chunk size:
``active[I, J]`` (some query of chunk I may see some key of chunk J, for some
sample and head; an over-approximation is safe) and ``full[I, J]`` (every entry
allowed: the block runs with no mask at all).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core import attention as local_attention
from ..functional.shifted import shift_modifier
from ..masks import Mask, shifted

__all__ = ["Setting", "block_attention", "chunk_maps", "chunk_plan", "as_rows"]


@dataclass(frozen=True)
class Setting:
    """What every block of one call shares: the global mask and bias, the scale, the global length and chunk size."""

    mask: Mask | None
    bias: object  # None, a modifier, or a float tensor (B|1, H|1, L, L)
    scale: float
    length: int
    chunk: int
    active: tuple[tuple[bool, ...], ...]
    full: tuple[tuple[bool, ...], ...]
    active_map: torch.Tensor  # ``active`` as a bool tensor (n, n) on the CPU
    full_map: torch.Tensor  # ``full`` likewise
    ulysses_size: int | None = None  # scheme="usp": the ranks of a Ulysses group


def chunk_maps(mask: Mask | None, length: int, chunk: int, batch: int, heads: int, device):
    """``(active, full)``: n x n bool tensors (CPU) over chunk pairs (any sample and head / every one).

    An empty sequence (``length == 0``) has no chunk pair: ``(0, 0)`` maps.
    """
    n = length // chunk if length else 0
    if mask is None or n == 0:
        everything = torch.ones(n, n, dtype=torch.bool)
        return everything, everything
    layout = mask.block_layout(length, length, chunk, device=device, batch=batch, heads=heads)
    return layout.active.flatten(0, 1).any(0).cpu(), layout.full.flatten(0, 1).all(0).cpu()


def as_rows(chunk_map: torch.Tensor) -> tuple[tuple[bool, ...], ...]:
    """A chunk map as tuples of bools, for reading one pair at a time without tensor indexing."""
    return tuple(tuple(row) for row in chunk_map.tolist())


def chunk_plan(mask: Mask | None, length: int, chunk: int, batch: int, heads: int, device):
    """``(active, full)``: n x n tuples of bools over chunk pairs (any sample and head / every one)."""
    return tuple(as_rows(m) for m in chunk_maps(mask, length, chunk, batch, heads, device))


def block_attention(s: Setting, q, k, v, *, q0: int, k0: int, h0: int = 0, full: bool = False):
    """``(out, lse)`` of queries at global rows ``q0 + i`` against keys ``k0 + j``, heads ``h0 + h``.

    ``full``: every entry of the block is allowed (the caller read it off the chunk plan), so no mask is passed.
    """
    nq, nk, nh = q.shape[-2], k.shape[-2], q.shape[1]
    mask = None if full else shifted(s.mask, q0=q0, k0=k0, h0=h0, q_len=s.length, kv_len=s.length)
    if isinstance(s.bias, torch.Tensor):
        heads = slice(h0, h0 + nh) if s.bias.shape[1] > 1 else slice(None)
        bias = s.bias[:, heads, q0:q0 + nq, k0:k0 + nk]
    else:
        bias = shift_modifier(s.bias, q0=q0, k0=k0, h0=h0, q_len=s.length, kv_len=s.length)
    result = local_attention(q, k, v, mask=mask, bias=bias, scale=s.scale, return_lse=True)
    out = result.output
    if torch.is_grad_enabled() and not out.requires_grad and any(t.requires_grad for t in (q, k, v)):
        out = _ZeroGradient.apply(out, q, k, v)  # a block that allows nothing came back detached
    return out, result.lse


class _ZeroGradient(torch.autograd.Function):
    """``out`` unchanged, attached to the graph with zero gradients for q, k, v (a block with no allowed entry)."""

    @staticmethod
    def forward(ctx, out, q, k, v):
        ctx.shapes = [(t.shape, t.dtype) for t in (q, k, v)]
        return out.clone()

    @staticmethod
    def backward(ctx, grad):
        return (None, *(grad.new_zeros(shape, dtype=dtype) for shape, dtype in ctx.shapes))
