"""Segment sums of log decays and the decayed products ``sum_d a_id b_jd exp(seg_ijd)`` built on them.

A gated recurrence decays its state by ``exp(g_t)`` at every step, so what token ``j`` wrote
reaches token ``i >= j`` multiplied by ``exp(g_{j+1} + ... + g_i)``. Those exponents, for every
pair, are the *segment sums* of ``g`` (Dao & Gu 2024, arXiv:2405.21060, Sec. 6, ``segsum``)::

    segsum(g)[i, j] = g_{j+1} + ... + g_i   (j <= i; 0 on the diagonal)      -inf   (j > i)

so ``exp(segsum(g))`` is the lower-triangular decay mask (``gamma^(i - j)`` for a constant
``g = log gamma``: RetNet's D). Each entry is summed directly over its own segment, not as the
difference ``cumsum_i - cumsum_j`` of two long prefix sums, which would cancel catastrophically
once the prefix sums grow large. ``g`` is ``(..., T, G)``: ``G = 1`` for one decay per head and
step (RetNet, Mamba-2, Gated DeltaNet), ``G = Dk`` for one per key channel (GLA, Kimi).
"""

from __future__ import annotations

import torch

__all__ = ["segsum", "decayed_products"]


def segsum(g: torch.Tensor) -> torch.Tensor:
    """``(..., T, G)`` log decays -> ``(..., T, T, G)`` segment sums, ``-inf`` above the diagonal."""
    t = g.shape[-2]
    later = torch.ones(t, t, dtype=torch.bool, device=g.device).tril(-1)[..., None]  # [k, j]: k > j
    rows = g.unsqueeze(-2).expand(*g.shape[:-1], t, g.shape[-1])  # rows[k, j] = g_k: (..., T, T, G)
    sums = rows.masked_fill(~later, 0.0).cumsum(-3)  # sums[i, j] = sum of g_k over j < k <= i
    return sums.masked_fill(~(later | torch.eye(t, dtype=torch.bool, device=g.device)[..., None]), float("-inf"))


def decayed_products(a: torch.Tensor, b: torch.Tensor, decay: torch.Tensor) -> torch.Tensor:
    """``out[i, j] = sum_d a_id b_jd decay_ijd`` for ``a`` ``(..., T, D)``, ``b`` ``(..., S, D)``, ``decay``
    ``(..., T, S, G)`` with ``G`` 1 (one decay for every channel: a masked matrix product) or ``D``."""
    if decay.shape[-1] == 1:
        return (a @ b.transpose(-1, -2)) * decay[..., 0]
    return torch.einsum("...id,...jd,...ijd->...ij", a, b, decay)
