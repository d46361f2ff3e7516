"""FlexAttention's ``BlockMask`` read as an attnkit mask: exactly what FlexAttention allows.

A ``BlockMask`` (FlexAttention, Dong et al. 2024, arXiv:2412.05496) is tiles of ``(BQ, BK)``
queries x keys, each empty, full or partial (see :mod:`.block_masks`). :func:`from_block_mask`
makes the attnkit mask that allows every entry of a full tile, ``mask_mod`` in a partial tile
and nothing in an empty one. Its layout at the tile size is the ``BlockMask``'s own, so a round
trip through :meth:`~attnkit.masks.base.Mask.to_block_mask` returns the same tiles; at
other block sizes it is derived from the tiles (a block is active where a tile it meets is,
full where all are), never dropping an allowed entry.

Shapes: the dense tile maps are ``(B|1, H|1, ceil(Lq / BQ), ceil(Lk / BK))`` bool.
"""

from __future__ import annotations

import torch

from ..errors import DTypeError
from .base import Mask, gather_at

__all__ = ["from_block_mask", "BlockMaskMask"]


def _dense(num: torch.Tensor, indices: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``(num_blocks, indices)`` -> the dense bool tile map ``(..., rows, cols)`` (entries past ``num`` unused)."""
    num, indices = num[..., :rows], indices[..., :rows, :]
    used = torch.arange(indices.shape[-1], device=indices.device) < num[..., None]
    slots = torch.where(used & (indices < cols), indices.long(), cols)  # unused slots write one column too far
    dense = torch.zeros((*indices.shape[:-1], cols + 1), dtype=torch.bool, device=indices.device)
    return dense.scatter_(-1, slots, True)[..., :cols]


def _spans(length: int, block: int, tile: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """For each block of ``block`` positions, the first and last tile of ``tile`` positions it meets."""
    first = torch.arange(0, length, block, device=device)
    last = (first + block).clamp(max=length) - 1
    return first // tile, last // tile


def _coarsen(tiles: torch.Tensor, rows: tuple, cols: tuple) -> torch.Tensor:
    """Per block, how many of the tiles it meets are set: a 2-D prefix sum read at each block's span."""
    counts = torch.nn.functional.pad(tiles.to(torch.int32).cumsum(-2).cumsum(-1), (1, 0, 1, 0))
    (r0, r1), (c0, c1) = rows, cols
    r0, r1, c0, c1 = r0[:, None], r1[:, None] + 1, c0[None, :], c1[None, :] + 1
    return counts[..., r1, c1] - counts[..., r0, c1] - counts[..., r1, c0] + counts[..., r0, c0]


class BlockMaskMask(Mask):
    """A FlexAttention ``BlockMask`` as an attnkit mask (made by :func:`from_block_mask`)."""

    kind = "pattern"

    def __init__(self, block_mask):
        q_len, kv_len = (int(n) for n in block_mask.seq_lengths)
        self.tile = tuple(int(n) for n in block_mask.BLOCK_SIZE)
        rows, cols = -(-q_len // self.tile[0]), -(-kv_len // self.tile[1])
        partial = _dense(block_mask.kv_num_blocks, block_mask.kv_indices, rows, cols)
        full = (torch.zeros_like(partial) if block_mask.full_kv_num_blocks is None else
                _dense(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, rows, cols))
        self.active, self.full = partial | full, full
        self.mask_mod = block_mask.mask_mod
        self.q_len, self.kv_len = q_len, kv_len
        batch, heads = self.active.shape[:2]
        self.batch_size = batch if batch > 1 else None
        self.num_heads = heads if heads > 1 else None

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        bq, bk = self.tile
        where = (b, h, q_idx // bq, kv_idx // bk)
        inside = self.mask_mod(b, h, q_idx, kv_idx)
        if not isinstance(inside, torch.Tensor) or inside.dtype != torch.bool:
            raise DTypeError(f"the BlockMask's mask_mod must return a bool tensor; got "
                             f"{getattr(inside, 'dtype', type(inside).__name__)}")
        return gather_at(self.full, *where) | (gather_at(self.active, *where) & inside)

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        active, full = self.active.to(device), self.full.to(device)
        if self.tile == (bs, bs):
            return active, full
        rows, cols = _spans(q_len, bs, self.tile[0], device), _spans(kv_len, bs, self.tile[1], device)
        area = (rows[1] - rows[0] + 1)[:, None] * (cols[1] - cols[0] + 1)[None, :]
        return _coarsen(active, rows, cols) > 0, _coarsen(full, rows, cols) == area

    def __repr__(self):
        return f"from_block_mask(BLOCK_SIZE={self.tile}, seq_lengths={(self.q_len, self.kv_len)})"


def from_block_mask(block_mask) -> Mask:
    """The attnkit mask that allows what FlexAttention allows under ``block_mask``.

    Every entry of a full tile, ``block_mask.mask_mod`` in a partial tile, nothing in an
    empty one; the mask holds the sizes the block mask was made for (batch and heads
    when it has more than one, both lengths), which :func:`attnkit.attention` checks.
    ``mask_mod`` is called with broadcasting index tensors, as every attnkit mask is: the
    elementwise functions FlexAttention takes work unchanged. As in torch's compiled kernel, the
    tiles of a block mask built with ``B=None``/``H=None`` serve every batch and head, and
    ``mask_mod`` sees the call's ``b`` and ``h`` in partial tiles only (:mod:`attnkit.flex`).

    Example:
        >>> from torch.nn.attention.flex_attention import create_block_mask
        >>> bm = create_block_mask(lambda b, h, q, k: q >= k, None, None, 256, 256, device="cpu")
        >>> m = from_block_mask(bm)
        >>> bool((m.materialize(256, 256)[0, 0] == torch.ones(256, 256, dtype=torch.bool).tril()).all())
        True
    """
    if not all(hasattr(block_mask, name) for name in ("kv_num_blocks", "kv_indices", "BLOCK_SIZE", "mask_mod")):
        raise DTypeError(f"from_block_mask needs a torch.nn.attention.flex_attention.BlockMask; got "
                         f"{type(block_mask).__name__}")
    return BlockMaskMask(block_mask)
