"""Masks and score modifiers defined over a whole sequence, evaluated on one block of it.

A model that decodes with a KV cache, or a rank that holds one shard of a sequence,
computes attention between a block of queries at global positions
``q_offset .. q_offset + Lq - 1`` and a block of keys at ``kv_offset .. kv_offset + Lk - 1``
of one sequence of ``length`` positions. A mask or modifier written for the whole
sequence (``causal()``, ``global_tokens([0])``, ``alibi(8)``) means the same on every
such block when it is evaluated at the global positions, as if the call were
``Lq = Lk = length``:

    allowed_block[i, j] = mask.allows(q_offset + i, kv_offset + j, length, length)

A band ``lo <= j - i <= hi`` of the whole sequence stays a band on the block, shifted by
``q_offset - kv_offset``, so the block-sparse band path still serves it.

Example:
    >>> from attnkit import masks
    >>> m = masks.positioned(masks.causal(), q_offset=3, kv_offset=0, length=4)  # decoding token 3
    >>> m.materialize(1, 4)[0, 0].int().tolist()
    [[1, 1, 1, 1]]
    >>> m.band(1, 4)
    (None, 3)
"""

from __future__ import annotations

from ..bias import AdditiveModifier, ScoreModifier, Softcap, apply_modifier
from ..errors import check_int
from .mask_base import Mask
from .masks import diagonals

__all__ = ["positioned", "positioned_modifier"]


def _check_positions(q_offset, kv_offset, length) -> tuple[int, int, int]:
    return (check_int(None, "q_offset", q_offset), check_int(None, "kv_offset", kv_offset),
            check_int(None, "length", length))


class _Positioned(Mask):
    """``mask`` of a sequence of ``length`` positions, seen from a block at ``(q_offset, kv_offset)``."""

    def __init__(self, mask: Mask, q_offset: int, kv_offset: int, length: int):
        self.inner = mask
        self.q_offset, self.kv_offset, self.length = q_offset, kv_offset, length
        self.uses = mask.uses
        self.batch_size, self.num_heads = mask.batch_size, mask.num_heads

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        return self.inner.allows(b, h, q_idx + self.q_offset, kv_idx + self.kv_offset, self.length, self.length)

    def band(self, q_len, kv_len):
        whole = self.inner.band(self.length, self.length)
        if whole is None:
            return None
        shift = self.q_offset - self.kv_offset  # j - i on the block = (global j - global i) + shift
        return tuple(None if end is None else end + shift for end in whole)

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        band = self.band(q_len, kv_len)
        if band is not None:
            return diagonals(*band).block_layout(q_len, kv_len, bs, device=device)[:2]
        return self._evaluated_layout(q_len, kv_len, bs, device, sizes)

    def __repr__(self):
        return (f"positioned({self.inner!r}, q_offset={self.q_offset}, kv_offset={self.kv_offset}, "
                f"length={self.length})")


def positioned(mask: Mask, *, q_offset: int, kv_offset: int, length: int) -> Mask:
    """``mask`` over a sequence of ``length`` positions, evaluated on the block of queries from
    ``q_offset`` and keys from ``kv_offset`` (see the module docstring)."""
    q_offset, kv_offset, length = _check_positions(q_offset, kv_offset, length)
    return _Positioned(mask, q_offset, kv_offset, length)


class _PositionedTerm(AdditiveModifier):
    """An additive modifier (ALiBi, relative biases) at global positions: still a term for fused kernels."""

    def __init__(self, inner: AdditiveModifier, q_offset: int, kv_offset: int, length: int):
        self.inner, self.q_offset, self.kv_offset, self.length = inner, q_offset, kv_offset, length

    def term(self, b, h, q_idx, kv_idx, q_len, kv_len):
        return self.inner.term(b, h, q_idx + self.q_offset, kv_idx + self.kv_offset, self.length, self.length)

    def term_is_finite(self):
        return self.inner.term_is_finite()

    def parameters_needing_grad(self):
        return self.inner.parameters_needing_grad()

    def __repr__(self):
        return f"positioned({self.inner!r}, q_offset={self.q_offset}, kv_offset={self.kv_offset})"


class _PositionedModifier(ScoreModifier):
    """Any modifier at global positions."""

    def __init__(self, inner, q_offset: int, kv_offset: int, length: int):
        self.inner, self.q_offset, self.kv_offset, self.length = inner, q_offset, kv_offset, length

    def modify(self, scores, b, h, q_idx, kv_idx, q_len, kv_len):
        return apply_modifier(self.inner, scores, b, h, q_idx + self.q_offset, kv_idx + self.kv_offset,
                              self.length, self.length)

    def __repr__(self):
        return f"positioned({self.inner!r}, q_offset={self.q_offset}, kv_offset={self.kv_offset})"


def positioned_modifier(modifier, *, q_offset: int, kv_offset: int, length: int):
    """A score modifier over a sequence of ``length`` positions, evaluated on a block (as :func:`positioned`).

    A modifier that reads no position (soft-capping) is returned unchanged, so kernels
    that recognise it keep serving it.
    """
    q_offset, kv_offset, length = _check_positions(q_offset, kv_offset, length)
    if isinstance(modifier, Softcap):
        return modifier
    if isinstance(modifier, AdditiveModifier):
        return _PositionedTerm(modifier, q_offset, kv_offset, length)
    return _PositionedModifier(modifier, q_offset, kv_offset, length)
