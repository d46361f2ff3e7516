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
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .segsum import decayed_products, segsum, shifted, split_decayed_products, suffix_sums

__all__ = ["Local", "local_terms", "inverts"]


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

