"""Decayed linear attention: RetNet's fixed decay per head and GLA's data-dependent gates per key channel.

Both are the recurrence ``S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T``, ``o_t = S_t^T q_t`` (no
normaliser, no delta rule) in the three forms of :mod:`.forms`; they differ in where the decay
comes from.
"""

from __future__ import annotations

import torch

from ...errors import ArgumentError
from .forms import check_qkv, check_tensor, gated_recurrence

__all__ = ["retention", "gated_linear_attention"]


def retention(q, k, v, decay=None, *, g=None, scale=None, form: str = "chunk", chunk_size: int = 64,
              initial_state=None, cu_seqlens=None):
    """Retention: causal linear attention whose state decays by a fixed ``gamma`` per head.

    Sun et al. 2023, "Retentive Network", arXiv:2307.08621, eq. 5-7: recurrent
    ``S_n = gamma S_{n-1} + K_n^T V_n``, ``o_n = Q_n S_n``; parallel
    ``Retention(X) = (Q K^T * D) V`` with ``D_nm = gamma^(n - m)`` for ``n >= m``, else 0; chunkwise
    the same per block with the state carried across. Notation: ``gamma`` = ``decay[h]``.

    Differences from the paper: ``q`` is scaled by ``scale`` (``Dk^-1/2`` by default; the paper's
    normalisations, Sec. 2.2, are the module's). The xPos rotation and the group norm are the
    module's (:class:`attnkit.nn.RetNetRetention`).

    Shapes: ``q, k`` ``(B, Hk, L, Dk)``, ``v`` ``(B, H, L, Dv)`` (H a multiple of Hk: each q/k head
    serves ``H / Hk`` consecutive value heads), ``decay`` ``(H,)`` in (0, 1], ``initial_state``
    ``(N, H, Dk, Dv)`` -> ``(out (B, H, L, Dv), final state (N, H, Dk, Dv))``; N = B, or the number of
    documents when ``cu_seqlens`` ``(N + 1,)`` packs them into ``(1, H, T, D)`` tensors.

    ``g`` ``(B, H, L)``, in place of ``decay``: the log decays per token, ``log gamma_h`` at every token of
    head ``h`` for this function's recurrence; a token whose ``g`` is 0 and whose key is 0 neither decays nor
    writes the state (a padded token: what :class:`attnkit.nn.RetNetRetention` and
    :class:`attnkit.nn.LightningAttention` pass, their decays given as logs).

    Complexity: parallel O(L^2 (Dk + Dv)); chunk O(L c (Dk + Dv) + L Dk Dv); recurrent O(L Dk Dv).

    Args:
        q, k, v: queries, keys, values.
        decay: ``gamma`` per head.
        g: log decays per token (exactly one of ``decay`` and ``g``).
        scale: multiplies q (default ``Dk ** -0.5``).
        form: "parallel", "chunk" or "recurrent" (the same function).
        chunk_size: block length of the chunk form.
        initial_state: state before the first token (zeros if None).
        cu_seqlens: document boundaries of packed input (each document starts from its own state).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 6)
        >>> out, state = retention(q, k, v, torch.tensor([0.9, 0.5, 0.99]))
        >>> out.shape, state.shape
        (torch.Size([2, 3, 5, 6]), torch.Size([2, 3, 4, 6]))
        >>> torch.allclose(out, retention(q, k, v, torch.tensor([0.9, 0.5, 0.99]), form="recurrent")[0], atol=1e-5)
        True
    """
    if (decay is None) == (g is None):
        raise ArgumentError("retention: give exactly one of decay (H,) and g (B, H, L); got "
                            f"{'neither' if decay is None else 'both'}")
    if g is not None:
        return gated_recurrence("retention", q, k, v, g, scale=scale, normalize_qk=False, form=form,
                                chunk_size=chunk_size, initial_state=initial_state, cu_seqlens=cu_seqlens)
    b, h, n, _, _ = check_qkv("retention", q, k, v)
    check_tensor("retention", "decay", decay, (h,), "(H,)", q.device)
    if not bool(((decay > 0) & (decay <= 1)).all()):
        raise ArgumentError(f"retention: decay must lie in (0, 1]; got {decay.tolist()}")
    g = decay.to(torch.promote_types(decay.dtype, torch.float32)).log()[:, None].expand(b, h, n)
    return gated_recurrence("retention", q, k, v, g, scale=scale, normalize_qk=False, form=form,
                            chunk_size=chunk_size, initial_state=initial_state, cu_seqlens=cu_seqlens)


def gated_linear_attention(q, k, v, g, *, scale=None, form: str = "chunk", chunk_size: int = 16, initial_state=None,
                           cu_seqlens=None):
    """Gated linear attention: the state decays by a data-dependent gate per key channel.

    Yang et al. 2023, "Gated Linear Attention Transformers with Hardware-Efficient Training",
    arXiv:2312.06635, Sec. 4: ``S_t = (alpha_t^T 1) * S_{t-1} + k_t^T v_t``, ``o_t = q_t S_t``;
    parallel ``O = ((Q * B)(K / B)^T * M) V`` with ``B_t = prod_{s <= t} alpha_s`` here
    evaluated as segment sums of ``log alpha`` so nothing is divided. Notation: ``log alpha_t`` =
    ``g[..., t, :]``.

    Differences from the paper: q is scaled by ``scale`` (``Dk^-1/2`` by default, as their code);
    the decayed block scores split each block in halves down to single tokens (the paper's
    secondary-level chunking, Sec. 4.3, with every exponent a sum over its own segment:
    :func:`attnkit.functional.recurrences.local.split_decayed_products`), so no ``c x c x Dk`` mask is held.

    Shapes: as :func:`retention`, with ``g`` ``(B, H, L, Dk)`` log gates (<= 0 for a decay).

    Complexity: parallel O(L^2 Dk + L^2 Dv); chunk O(L c Dk + L c Dv + L Dk Dv); recurrent O(L Dk Dv).

    Args:
        q, k, v: queries, keys, values.
        g: log forget gates per key channel.
        scale, form, chunk_size, initial_state, cu_seqlens: as :func:`retention`.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(1, 2, 7, 4), torch.randn(1, 2, 7, 4), torch.randn(1, 2, 7, 3)
        >>> g = F.logsigmoid(torch.randn(1, 2, 7, 4))
        >>> out, state = gated_linear_attention(q, k, v, g, chunk_size=3)
        >>> torch.allclose(out, gated_linear_attention(q, k, v, g, form="parallel")[0], atol=1e-5)
        True
    """
    return gated_recurrence("gated_linear_attention", q, k, v, g, per_channel=True, scale=scale, normalize_qk=False,
                            form=form, chunk_size=chunk_size, initial_state=initial_state, cu_seqlens=cu_seqlens)
