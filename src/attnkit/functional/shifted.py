"""Masks and score modifiers evaluated on an offset block of global positions.

A sequence split over processes gives every process a block of the scores,
rows ``[q0, q0 + Lq)`` and columns ``[k0, k0 + Lk)`` of a global ``L_q x L_k``
problem, and heads ``[h0, h0 + H)`` of all heads. Masks and modifiers are
functions of indices, so the block's values are the global predicate read at
shifted indices::

    local (b, h, i, j)  ->  global (b, h + h0, i + q0, j + k0), lengths (L_q, L_k)

:func:`shift_mask` and :func:`shift_modifier` are the one place that shift is
written; the local block then runs through ``attnkit.attention`` like any call.
A band ``lo <= j - i <= hi`` stays a band (shifted by ``k0 - q0``), so band
kernels still read contiguous key windows; a shifted band that is the plain lower
triangle is returned as ``causal()``, so the common diagonal block takes the O(1) path.

A model decoding over a KV cache is the same picture: its queries are rows ``q0 ..`` of the
whole sequence, its cache the keys ``k0 ..``; a mask given for the whole sequence means the
same in one pass and in cached decoding (``attnkit.integrations.transformers`` reads
registered masks and biases this way).

Example:
    >>> from attnkit import masks
    >>> m = shift_mask(masks.causal(), q0=4, k0=2, q_len=8, kv_len=8)
    >>> m.materialize(2, 2)[0, 0].int().tolist()   # global rows 4-5 against keys 2-3
    [[1, 1], [1, 1]]
    >>> shift_mask(masks.causal(), q0=4, k0=4, q_len=8, kv_len=8)
    causal(align='top_left')
"""

from __future__ import annotations

from ..bias import AdditiveModifier, ScoreModifier, Softcap, apply_modifier
from .mask_base import Mask
from .masks import causal, diagonals

__all__ = ["ShiftedMask", "shift_mask", "shift_modifier"]


class ShiftedMask(Mask):
    """``parent`` read at global indices: ``allows(b, h, i, j) = parent.allows(b, h + h0, i + q0, j + k0, Lq, Lk)``.

    The data the parent holds (segment ids, padding lengths, dense tensors) is for the
    whole problem, so the shifted mask ties itself to no length or head count; the
    batch is not split and keeps the parent's batch size.
    """

    def __init__(self, parent: Mask, *, q0: int, k0: int, h0: int, q_len: int, kv_len: int):
        self.parent, self.q0, self.k0, self.h0 = parent, q0, k0, h0
        self.global_q_len, self.global_kv_len = q_len, kv_len
        self.uses = parent.uses
        self.batch_size = parent.batch_size

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        return self.parent.allows(b, h + self.h0, q_idx + self.q0, kv_idx + self.k0,
                                  self.global_q_len, self.global_kv_len)

    def band(self, q_len, kv_len):
        band = self.parent.band(self.global_q_len, self.global_kv_len)
        if band is None:
            return None
        d = self.k0 - self.q0  # local j - i = global (j - i) - d
        return tuple(None if edge is None else edge - d for edge in band)

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        band = self.band(q_len, kv_len)
        if band is not None and self.uses <= {"q", "kv"}:  # analytic, from the shifted band
            return diagonals(*band).block_layout(q_len, kv_len, bs, device=device)[:2]
        return self._evaluated_layout(q_len, kv_len, bs, device, sizes)

    def key_padding(self):
        part = self.parent.key_padding()
        return None if part is None else _shift(part, self)

    def __repr__(self):
        return f"shifted({self.parent!r}, q0={self.q0}, k0={self.k0}, h0={self.h0})"


def _shift(mask: Mask, like: ShiftedMask) -> ShiftedMask:
    return ShiftedMask(mask, q0=like.q0, k0=like.k0, h0=like.h0, q_len=like.global_q_len,
                       kv_len=like.global_kv_len)


def shift_mask(mask: Mask | None, *, q0: int = 0, k0: int = 0, h0: int = 0, q_len: int, kv_len: int) -> Mask | None:
    """The block of ``mask`` at rows ``q0 + i``, keys ``k0 + j``, heads ``h0 + h`` of a ``q_len x kv_len`` problem.

    None stays None; a pure band whose block is the lower triangle becomes ``causal()``.
    """
    if mask is None:
        return None
    shifted = ShiftedMask(mask, q0=q0, k0=k0, h0=h0, q_len=q_len, kv_len=kv_len)
    if mask.uses <= {"q", "kv"} and shifted.band(0, 0) == (None, 0):
        return causal("top_left")  # the block's rows and columns are square-aligned at the diagonal
    return shifted


class _ShiftedModifier(ScoreModifier):
    """Any modifier read at global indices and lengths."""

    def __init__(self, parent, q0, k0, h0, q_len, kv_len):
        self.parent, self.q0, self.k0, self.h0 = parent, q0, k0, h0
        self.global_q_len, self.global_kv_len = q_len, kv_len

    def modify(self, scores, b, h, q_idx, kv_idx, q_len, kv_len):
        return apply_modifier(self.parent, scores, b, h + self.h0, q_idx + self.q0, kv_idx + self.k0,
                              self.global_q_len, self.global_kv_len)

    def __repr__(self):
        return f"shifted({self.parent!r}, q0={self.q0}, k0={self.k0}, h0={self.h0})"


class _ShiftedAdditive(_ShiftedModifier, AdditiveModifier):
    """An additive modifier read at global indices: still additive (and relative if the parent is)."""

    def __init__(self, parent: AdditiveModifier, *args):
        super().__init__(parent, *args)
        self.relative = parent.relative

    def term(self, b, h, q_idx, kv_idx, q_len, kv_len):
        return self.parent.term(b, h + self.h0, q_idx + self.q0, kv_idx + self.k0,
                                self.global_q_len, self.global_kv_len)

    def relative_term(self, h, rel, q_len, kv_len):
        return self.parent.relative_term(h + self.h0, rel + (self.k0 - self.q0), self.global_q_len, self.global_kv_len)

    def term_is_finite(self):
        return self.parent.term_is_finite()

    def parameters_needing_grad(self):
        return self.parent.parameters_needing_grad()


def shift_modifier(modifier, *, q0: int = 0, k0: int = 0, h0: int = 0, q_len: int, kv_len: int):
    """``modifier`` read at global indices and lengths (None stays None; a soft-cap reads no index and is kept)."""
    if modifier is None or type(modifier) is Softcap:
        return modifier
    cls = _ShiftedAdditive if isinstance(modifier, AdditiveModifier) else _ShiftedModifier
    return cls(modifier, q0, k0, h0, q_len, kv_len)
