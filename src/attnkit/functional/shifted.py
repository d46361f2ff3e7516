"""Score modifiers evaluated on an offset block of global positions (the mask side is :func:`attnkit.masks.shifted`).

A sequence split over processes gives every process a block of the scores,
rows ``[q0, q0 + Lq)`` and columns ``[k0, k0 + Lk)`` of a global ``L_q x L_k``
problem, and heads ``[h0, h0 + H)`` of all heads. Masks and modifiers are
functions of indices, so the block's values are the global predicate read at
shifted indices::

    local (b, h, i, j)  ->  global (b, h + h0, i + q0, j + k0), lengths (L_q, L_k)

:func:`attnkit.masks.shifted` and :func:`shift_modifier` are the one place that shift is
written; the local block then runs through ``attnkit.attention`` like any call.
A model decoding over a KV cache is the same picture: its queries are rows ``q0 ..`` of the
whole sequence, its cache the keys ``k0 ..``; a mask or modifier given for the whole sequence
means the same in one pass and in cached decoding (``attnkit.integrations.transformers`` reads
registered masks and biases this way).
"""

from __future__ import annotations

from ..bias import AdditiveModifier, ScoreModifier, Softcap, apply_modifier

__all__ = ["shift_modifier"]


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
