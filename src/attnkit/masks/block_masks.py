"""attnkit masks as FlexAttention's ``BlockMask``: the block layout becomes the tiles, the predicate the mask_mod.

FlexAttention (Dong et al. 2024, "Flex Attention: A Programming Model for Generating
Optimized Attention Kernels", arXiv:2412.05496, Sec. 3.2) describes a mask by tiles of
``BLOCK_SIZE = (BQ, BK)`` queries x keys, each one of three kinds::

    empty    skipped (no entry allowed)
    full     every entry allowed: mask_mod is not evaluated there
    partial  mask_mod(b, h, q_idx, kv_idx) decides each entry

kept as ``(kv_num_blocks, kv_indices)`` per query tile for the partial tiles and
``(full_kv_num_blocks, full_kv_indices)`` for the full ones, ``(B|1, H|1, nQ[, nK])``.
An attnkit :class:`~attnkit.masks.base.BlockLayout` says the same with two
bool maps: ``active`` (partial or full) and ``full``. :func:`to_block_mask` builds a
``BlockMask`` from an attnkit mask: its block layout (analytic for the built-in masks: no
``Lq x Lk`` picture) and the mask's own predicate as ``mask_mod``. Tiles cut by the end of
a sequence are never full, as in ``create_block_mask``, which counts the padding past the
end as masked. The other way, :mod:`.flex_tiles` reads a ``BlockMask`` as an attnkit mask.

Shapes: the dense tile maps are ``(B|1, H|1, ceil(Lq / BQ), ceil(Lk / BK))`` bool.
"""

from __future__ import annotations

import torch

from ..errors import ArgumentError

__all__ = ["FLEX_BLOCK", "mask_mod", "to_block_mask", "ordered"]

FLEX_BLOCK = 128  # torch's default tile (``_DEFAULT_SPARSE_BLOCK_SIZE``)


def mask_mod(mask, q_len: int, kv_len: int):
    """``mask`` as FlexAttention's ``mask_mod(b, h, q_idx, kv_idx) -> bool``, at the lengths of one call.

    FlexAttention traces a mask_mod with 32-bit index scalars; attnkit masks compute in
    64 bits (bounds far beyond any length), so the indices are widened first.
    """
    def allowed(b, h, q_idx, kv_idx):
        return mask.allows(b.long(), h.long(), q_idx.long(), kv_idx.long(), q_len, kv_len)
    return allowed


def ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense tile map -> ``(num_blocks, indices)``: the count per row, and the row's tiles first, in order."""
    as_int = dense.to(torch.int32)
    return (as_int.sum(-1, dtype=torch.int32),
            torch.argsort(as_int, dim=-1, descending=True, stable=True).to(torch.int32))


def _cut_tails_full(full: torch.Tensor, q_len: int, kv_len: int, block: int) -> torch.Tensor:
    """No tile cut by the end of a sequence is full (``create_block_mask`` counts the padding as masked)."""
    full = full.clone()
    if q_len % block:
        full[..., -1, :] = False
    if kv_len % block:
        full[..., -1] = False
    return full


def to_block_mask(mask, q_len: int, kv_len: int, *, batch: int | None = None, heads: int | None = None,
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
    return BlockMask.from_kv_blocks(*ordered(partial), *ordered(full), BLOCK_SIZE=block_size,
                                    mask_mod=mask_mod(mask, q_len, kv_len), seq_lengths=(q_len, kv_len))
