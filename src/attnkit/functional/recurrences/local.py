"""What one block of tokens does on its own: the terms of the chunked (and parallel) form of a gated recurrence.

The recurrence, per head, with state ``S`` ``(Dk, Dv)``, log decay ``g_t`` (one per head or per key
channel) and, for the delta rule, a write strength ``beta_t``::

    plain:   S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T
    delta:   S_t = diag(exp(g_t)) S_{t-1} + k_t d_t^T,   d_t = beta_t (v_t - (diag(exp(g_t)) S_{t-1})^T p_t)
             (p_t = k_t: the delta rule; another p_t: Comba's correction read at its own key;
             with pre_decay the correction reads S_{t-1} before its decay: the generalized delta rule)
    output:  o_t = S_t^T q_t

Over a block of c tokens entered with state ``S_0`` everything is linear in ``S_0``::

    o     = Q^ S_0 + A (U - W S_0)             final = diag(Gamma) S_0 + K~^T (U - W S_0)

    A_ij  = sum_d q_id k_jd exp(seg_ijd)        (j <= i; seg = segsum(g), the decay mask)
    Q^_i  = q_i * exp(g_1 + ... + g_i)          K~_j = k_j * exp(g_{j+1} + ... + g_c)    Gamma = exp(g_1 + ... + g_c)
    plain: U = V, W = 0
    delta: (I + T) [U | W] = diag(beta) [V | P^],  T_ij = beta_i sum_d p_id k_jd exp(seg_ijd) (i > j),
           P^_j = p_j * exp(g_1 + ... + g_j)

``U - W S_0`` are the values actually written (the delta rule's corrections); the unit lower
triangular solve is the WY / UT form of a product of Householder-like updates (Yang et al. 2024,
arXiv:2406.06484; with gates, arXiv:2412.06464). Every exponent is a sum of
log decays over a segment inside the block, so nothing overflows when the gates are ``<= 0``.

The decay masks are built from segment sums (the second half of this file, below the terms). A gated
recurrence decays its state by ``exp(g_t)`` at every step, so what token ``j`` wrote reaches token
``i >= j`` multiplied by ``exp(g_{j+1} + ... + g_i)``. Those exponents, for every pair, are the
*segment sums* of ``g`` (Dao & Gu 2024, arXiv:2405.21060, Sec. 6, ``segsum``)::

    segsum(g)[i, j] = g_{j+1} + ... + g_i   (j <= i; 0 on the diagonal)      -inf   (j > i)

so ``exp(segsum(g))`` is the lower-triangular decay mask (``gamma^(i - j)`` for a constant
``g = log gamma``: RetNet's D). Each entry is summed directly over its own segment, not as the
difference ``cumsum_i - cumsum_j`` of two long prefix sums, which would cancel catastrophically
once the prefix sums grow large. ``g`` is ``(..., T, G)``: ``G = 1`` for one decay per head and
step (RetNet, Mamba-2, Gated DeltaNet), ``G = Dk`` for one per key channel (GLA, Kimi).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = ["Local", "local_terms", "inverts", "segsum", "decayed_products", "suffix_sums",
           "split_decayed_products", "shifted"]


class Local(NamedTuple):
    """The terms of :func:`local_terms`, shapes for blocks of c tokens (leading dims ``...``)."""

    scores: torch.Tensor  # A (..., c, c)
    q_from_start: torch.Tensor  # Q^ (..., c, Dk): reads the entering state
    k_to_end: torch.Tensor  # K~ (..., c, Dk): writes into the leaving state
    decay: torch.Tensor  # Gamma (..., G, 1): the entering state's decay over the block
    u: torch.Tensor  # (..., c, Dv)
    w: torch.Tensor | None  # (..., c, Dk); None without the delta rule


def local_terms(q, k, v, g, beta, p=None, pre_decay: bool = False) -> Local:
    """The block terms for ``q, k`` ``(..., c, Dk)``, ``v`` ``(..., c, Dv)``, ``g`` ``(..., c, G)``, ``beta``
    ``(..., c)`` or None (no delta rule), ``p`` ``(..., c, Dk)`` the keys the correction reads (None: ``k``);
    ``pre_decay``: the correction of token ``i`` reads the state before ``g_i`` decays it (the decays in ``T``
    and ``P^`` then stop at ``g_{i-1}``: ``segsum`` and the cumulative sum shifted down one row, exact)."""
    start = g.cumsum(-2)  # (..., c, G): g_1 + ... + g_i, a sum of terms of one sign (no cancellation)
    if g.shape[-1] > 1:  # one decay per channel: no c x c x Dk mask (see split_decayed_products)
        def products(a, b, shift=False):
            return split_decayed_products(a, b, g, shift=shift)
        to_end = suffix_sums(g)
    else:
        seg = segsum(g)  # (..., c, c, 1): the decay mask is c x c
        mask = seg.exp()
        late = shifted(seg).exp() if pre_decay and beta is not None else mask  # reads before the decay

        def products(a, b, shift=False):
            return decayed_products(a, b, late if shift else mask)
        to_end = seg[..., -1, :, :]
    p = k if p is None else p
    lower: torch.Tensor | None  # None without the delta rule
    if beta is not None and not pre_decay and g.shape[-1] > 1:  # both share k and the decays: one pass for both
        scores, lower = split_decayed_products(torch.stack([q, p * beta[..., None]]), k, g).unbind(0)
    else:
        scores = products(q, k)
        lower = None if beta is None else products(p * beta[..., None], k, shift=pre_decay)
    terms = Local(scores, q * start.exp(), k * to_end.exp(), start[..., -1, :, None].exp(), v, None)
    if lower is None:
        return terms
    if pre_decay:
        start = torch.cat([torch.zeros_like(start[..., :1, :]), start[..., :-1, :]], -2)
    # only the strictly lower part of `lower` is read below
    c, written = lower.shape[-1], p * start.exp()
    if not inverts(c, k.shape[-1], v.shape[-1]):  # a long block (the parallel form): one solve, O(c^2 (Dk + Dv))
        rhs = beta[..., None] * torch.cat([v, written], -1)
        u, w = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True).split(
            [v.shape[-1], k.shape[-1]], -1)
        return terms._replace(u=u, w=w)
    eye = torch.eye(c, dtype=lower.dtype, device=lower.device).expand_as(lower)
    inverse = torch.linalg.solve_triangular(lower, eye, upper=False, unitriangular=True)  # (I + T)^-1, c x c
    inverse = inverse * beta[..., None, :]  # (I + T)^-1 diag(beta): products are faster than a solve with 2 D columns
    return terms._replace(u=inverse @ v, w=inverse @ written)


def inverts(c: int, dk: int, dv: int) -> bool:
    """Whether a block of ``c`` tokens takes the delta rule's explicit block inverse: when its ``c^3`` solve costs
    at most the ``c^2 (Dk + Dv)`` of solving for U and W directly (chunk-sized blocks; not the parallel form's)."""
    return c <= dk + dv


# ------------------------------------------------------------------ segment sums and decayed products
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
