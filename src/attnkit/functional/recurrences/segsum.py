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
import torch.nn.functional as F

__all__ = ["segsum", "decayed_products", "suffix_sums", "split_decayed_products", "shifted"]


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


def suffix_sums(g: torch.Tensor) -> torch.Tensor:
    """``(..., T, G)`` -> ``out[j] = g_{j+1} + ... + g_T`` (0 for the last), each summed over its own segment
    (the last row of :func:`segsum`)."""
    later = g[..., 1:, :].flip(-2).cumsum(-2).flip(-2)
    return torch.cat([later, torch.zeros_like(g[..., :1, :])], -2)


def split_decayed_products(a: torch.Tensor, b: torch.Tensor, g: torch.Tensor, *, shift: bool = False,
                           leaf: int = 1) -> torch.Tensor:
    """``decayed_products(a, b, exp(segsum(g)))`` for ``a, b, g`` ``(..., T, D)`` without the ``T x T x D`` mask.

    ``shift``: the mask of row ``i`` is row ``i - 1``'s (``exp(g_{j+1} + ... + g_{i-1})``, 0 on the diagonal
    and in row 0: the generalized delta rule's read before the decay).

    Blocks of ``leaf`` tokens are done with their full mask (one token by default: the fastest on a CPU);
    then, level by level, pairs of neighbouring
    blocks of ``m`` tokens merge into one of ``2 m``: above its diagonal 0, on it the two blocks, and below
    it, rows ``i`` of the second block and columns ``j`` of the first (which ends at ``h - 1``), one matrix
    product, since the exponent splits at ``h``::

        g_{j+1} + ... + g_i = (g_{j+1} + ... + g_{h-1}) + (g_h + ... + g_i)
        out[i, j] = sum_d (a_id exp(g_hd + ... + g_id)) (b_jd exp(g_{j+1,d} + ... + g_{h-1,d}))

    Each factor's exponent is summed over its own segment (no difference of prefix sums) and, for log
    decays ``g <= 0``, is ``<= 0``: neither factor exceeds ``|a|`` or ``|b|``, however strong the decay.
    Every level is one batched step (``T`` is padded to ``leaf`` times a power of two with tokens that
    neither decay nor read). Time O(T^2 D) in matrix products plus O(T D (leaf + log T)) elementwise;
    memory O(T^2 + T D log T).
    """
    t = a.shape[-2]
    size = leaf
    while size < t:
        size *= 2
    a, b, g = (F.pad(x, (0, 0, 0, size - t)) for x in (a, b, g))
    if leaf == 1:  # the diagonal: sum_d a_id b_id (no decay), or 0 when shifted
        out = (a * b).sum(-1)[..., None, None] * (not shift)  # (..., n, 1, 1)
    else:
        seg = segsum(g.unflatten(-2, (-1, leaf)))  # (..., size / leaf, leaf, leaf, D)
        out = decayed_products(a.unflatten(-2, (-1, leaf)), b.unflatten(-2, (-1, leaf)), shifted(seg).exp() if shift
                               else seg.exp())  # (..., n, m, m): the n blocks on the diagonal
    m = leaf
    while m < size:
        (_, a2), (b1, _), (g1, g2) = (x.unflatten(-2, (-1, 2, m)).unbind(-3) for x in (a, b, g))
        if shift:  # row i's decays stop at g_{i-1}
            g2 = torch.cat([torch.zeros_like(g2[..., :1, :]), g2[..., :-1, :]], -2)
        across = (a2 * g2.cumsum(-2).exp()) @ (b1 * suffix_sums(g1).exp()).transpose(-1, -2)  # (..., n / 2, m, m)
        top, bottom = out.unflatten(-3, (-1, 2)).unbind(-3)
        out = torch.cat([torch.cat([top, torch.zeros_like(top)], -1), torch.cat([across, bottom], -1)], -2)
        m *= 2
    return out[..., 0, :t, :t]


def shifted(seg: torch.Tensor) -> torch.Tensor:
    """Row ``i`` of segment sums ``(..., T, T, G)`` becomes row ``i - 1``'s (row 0: ``-inf``): decays that stop
    at ``g_{i-1}``."""
    return torch.cat([torch.full_like(seg[..., :1, :, :], float("-inf")), seg[..., :-1, :, :]], -3)
