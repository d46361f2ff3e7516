"""Comba: the gated delta rule whose correction reads the state at its own key (a closed-loop feedback term)."""

from __future__ import annotations

from .delta import _required
from .forms import check_tensor, gated_recurrence

__all__ = ["comba"]


def comba(q, k, v, p, g, beta, *, scale=None, normalize_qk: bool = False, form: str = "chunk", chunk_size: int = 64,
          initial_state=None, cu_seqlens=None, read_before_decay: bool = False):
    """The Comba recurrence: decay by ``alpha_t = exp(g_t)``, then write ``beta_t (v_t - S^T p_t)`` at key ``k_t``.

    Hu et al. 2025, "Comba: Improving Bilinear RNNs with Closed-loop Control", arXiv:2506.02475 (the
    recurrence of flash-linear-attention's ``naive_recurrent_comba``)::

        S_t = alpha_t (I - beta_t k_t p_t^T) S_{t-1} + beta_t k_t v_t^T      o_t = S_t^T q_t

    or, with ``read_before_decay``, the correction read from the state before its decay (the form of
    flash-linear-attention's chunk kernel, its ``naive_chunk_comba`` and its fused recurrent kernel,
    which its ``Comba`` layer trains with)::

        S_t = (alpha_t I - beta_t k_t p_t^T) S_{t-1} + beta_t k_t v_t^T

    (``S`` ``(Dk, Dv)``): the transition is a scaled identity plus a rank-one term whose left and
    right vectors differ (``p_t = k_t`` is :func:`attnkit.functional.recurrences.gated_delta_rule`). The
    chunk and parallel forms are the delta rule's UT transform with ``p`` in the triangular system
    (:mod:`.local`).

    Differences from the paper: none in the function; ``normalize_qk`` normalises q and k, never
    ``p``, which is used as given (the layer chooses it); q is scaled by ``scale`` (``Dk^-1/2``).

    Shapes: ``q, k, p`` ``(B, Hk, L, Dk)``, ``v`` ``(B, H, L, Dv)``, ``g, beta`` ``(B, H, L)``;
    ``form``, ``chunk_size``, ``initial_state``, ``cu_seqlens`` as :func:`attnkit.functional.recurrences.delta_rule`
    -> ``(out (B, H, L, Dv), final state (N, H, Dk, Dv))``.

    Complexity: as :func:`attnkit.functional.recurrences.delta_rule`.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> _ = torch.manual_seed(0)
        >>> (q, k, p), v = torch.randn(3, 1, 2, 9, 4).unbind(0), torch.randn(1, 2, 9, 3)
        >>> g, beta = F.logsigmoid(torch.randn(1, 2, 9)), torch.rand(1, 2, 9)
        >>> out, _ = comba(q, k, v, 0.1 * p, g, beta, normalize_qk=True, chunk_size=4)
        >>> torch.allclose(out, comba(q, k, v, 0.1 * p, g, beta, normalize_qk=True, form="recurrent")[0], atol=1e-5)
        True
    """
    check_tensor("comba", "p", p, tuple(q.shape), "(B, Hk, L, Dk), as q", q.device)
    return gated_recurrence("comba", q, k, v, g, _required("comba", beta), scale=scale, normalize_qk=normalize_qk,
                            form=form, chunk_size=chunk_size, initial_state=initial_state, cu_seqlens=cu_seqlens, p=p,
                            pre_decay=bool(read_before_decay))
