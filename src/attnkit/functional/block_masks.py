"""attnkit masks and FlexAttention's ``BlockMask``: one block layout, two spellings, converted both ways.

FlexAttention (Dong et al. 2024, "Flex Attention: A Programming Model for Generating
Optimized Attention Kernels", arXiv:2412.05496, Sec. 3.2) describes a mask by tiles of
``BLOCK_SIZE = (BQ, BK)`` queries x keys, each one of three kinds::

    empty    skipped (no entry allowed)
    full     every entry allowed: mask_mod is not evaluated there
    partial  mask_mod(b, h, q_idx, kv_idx) decides each entry

kept as ``(kv_num_blocks, kv_indices)`` per query tile for the partial tiles and
``(full_kv_num_blocks, full_kv_indices)`` for the full ones, ``(B|1, H|1, nQ[, nK])``.
An attnkit :class:`~attnkit.functional.mask_base.BlockLayout` says the same with two
bool maps: ``active`` (partial or full) and ``full``. So:

- :func:`to_block_mask` builds a ``BlockMask`` from an attnkit mask: its block layout
  (analytic for the built-in masks: no ``Lq x Lk`` picture) and the mask's own
  predicate as ``mask_mod``. Tiles cut by the end of a sequence are never full, as in
  ``create_block_mask``, which counts the padding past the end as masked.
- :func:`from_block_mask` reads a ``BlockMask`` back as an attnkit mask that allows
  exactly what FlexAttention allows: every entry of a full tile, ``mask_mod`` in a
  partial tile, nothing elsewhere. Its layout at the tile size is the ``BlockMask``'s
  own, so a round trip returns the same tiles; at other block sizes it is derived
  from the tiles (a block is active where a tile it meets is, full where all are).

Shapes: the dense tile maps are ``(B|1, H|1, ceil(Lq / BQ), ceil(Lk / BK))`` bool.
"""

from __future__ import annotations

import torch

from ..errors import ArgumentError, DTypeError
from .indexed_masks import gather_at
from .mask_base import Mask

__all__ = ["FLEX_BLOCK", "mask_mod", "to_block_mask", "from_block_mask", "BlockMaskMask"]

FLEX_BLOCK = 128  # torch's default tile (``_DEFAULT_SPARSE_BLOCK_SIZE``)


def mask_mod(mask: Mask, q_len: int, kv_len: int):
    """``mask`` as FlexAttention's ``mask_mod(b, h, q_idx, kv_idx) -> bool``, at the lengths of one call.

    FlexAttention traces a mask_mod with 32-bit index scalars; attnkit masks compute in
    64 bits (bounds far beyond any length), so the indices are widened first.
    """
    def allowed(b, h, q_idx, kv_idx):
        return mask.allows(b.long(), h.long(), q_idx.long(), kv_idx.long(), q_len, kv_len)
    return allowed


def _ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense tile map -> ``(num_blocks, indices)``: the count per row, and the row's tiles first, in order."""
    as_int = dense.to(torch.int32)
    return (as_int.sum(-1, dtype=torch.int32),
            torch.argsort(as_int, dim=-1, descending=True, stable=True).to(torch.int32))


def _dense(num: torch.Tensor, indices: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """``(num_blocks, indices)`` -> the dense bool tile map ``(..., rows, cols)`` (entries past ``num`` unused)."""
    num, indices = num[..., :rows], indices[..., :rows, :]
    used = torch.arange(indices.shape[-1], device=indices.device) < num[..., None]
    slots = torch.where(used & (indices < cols), indices.long(), cols)  # unused slots write one column too far
    dense = torch.zeros((*indices.shape[:-1], cols + 1), dtype=torch.bool, device=indices.device)
    return dense.scatter_(-1, slots, True)[..., :cols]


def _cut_tails_full(full: torch.Tensor, q_len: int, kv_len: int, block: int) -> torch.Tensor:
    """No tile cut by the end of a sequence is full (``create_block_mask`` counts the padding as masked)."""
    full = full.clone()
    if q_len % block:
        full[..., -1, :] = False
    if kv_len % block:
        full[..., -1] = False
    return full


def to_block_mask(mask: Mask, q_len: int, kv_len: int, *, batch: int | None = None, heads: int | None = None,
                  block_size: int = FLEX_BLOCK, device=None, exact: bool = False):
    """The FlexAttention ``BlockMask`` of ``mask`` for ``q_len`` queries and ``kv_len`` keys.

    Args:
        mask: any attnkit mask.
        q_len, kv_len: the lengths of the call (a band's alignment and the tiles depend on them).
        batch, heads: the sizes of the call, for masks that read ``b`` or ``h`` (else 1: broadcast).
        block_size: the tile, square (FlexAttention's default 128).
        device: where the tile maps live (the device of the call's tensors).
        exact: evaluate every entry for the layout (as ``create_block_mask`` does) instead of
            the mask's analytic layout, which may keep a tile partial that is in fact full or empty.

    Returns:
        ``torch.nn.attention.flex_attention.BlockMask`` with ``mask_mod`` reading ``mask``.
    """
    from torch.nn.attention.flex_attention import BlockMask

    if not isinstance(block_size, int) or block_size < 1:
        raise ArgumentError(f"to_block_mask: block_size must be an int >= 1; got {block_size!r}")
    layout = mask.block_layout(q_len, kv_len, block_size, device=device, exact=exact, batch=batch, heads=heads)
    full = _cut_tails_full(layout.full & layout.active, q_len, kv_len, block_size)
    partial = layout.active & ~full
    return BlockMask.from_kv_blocks(*_ordered(partial), *_ordered(full), BLOCK_SIZE=block_size,
                                    mask_mod=mask_mod(mask, q_len, kv_len), seq_lengths=(q_len, kv_len))


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
    elementwise functions FlexAttention takes work unchanged.

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
