"""Padded positions are inert: what a module does with the inputs a padding mask marks as padding.

The promise (docs/RELIABILITY.md, "Padding in modules"): given a padding mask, NaN or inf at
a padded position reaches no output at a real position and no gradient, of the parameters
or of the real inputs. Masking by select keeps a padded *key* out of every output already,
but its input row is still projected, and a padded *query* row of self-attention is projected
and attended like any other: ``0 * NaN`` then reaches the projections' weight gradients
(``dW = dY^T X`` sums over every row). So each module replaces the non-finite entries of its
padded input rows by 0, by select, before anything (a projection, a layer norm) reads them.

Finite values at padded positions are left as they are: they cannot change an output at a
real position (those keys are masked), their rows add exactly 0 to the gradients of a loss
that does not read the padded outputs, and `MultiHeadAttention` keeps giving
``torch.nn.MultiheadAttention``'s outputs at padded query rows.
"""

from __future__ import annotations

import torch

__all__ = ["clear_padding", "clear_key_padding"]


def clear_padding(x: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """``x`` ``(B, L, E)`` with NaN/inf at padded positions (``keep`` ``(B|1, L)`` False) replaced by 0."""
    if keep is None:
        return x
    return x.masked_fill(~keep[..., None] & ~torch.isfinite(x), 0.0)


def clear_key_padding(query, key, value, key_padding_mask: torch.Tensor | None, *, self_attention: bool):
    """:func:`clear_padding` for torch's ``key_padding_mask`` ``(B, S)`` (True or ``-inf`` = padding).

    Key and value rows are cleared; the query rows too in self-attention (query is key), where a
    padded key is also a padded query. Inputs are batch-first ``(B, L, E)``.
    """
    if key_padding_mask is None:
        return query, key, value
    pad = key_padding_mask if key_padding_mask.dtype == torch.bool else torch.isneginf(key_padding_mask)
    keep = ~pad.reshape(-1, key.shape[1])  # (B|1, S)
    key, value = clear_padding(key, keep), clear_padding(value, keep)
    return (clear_padding(query, keep) if self_attention else query), key, value
