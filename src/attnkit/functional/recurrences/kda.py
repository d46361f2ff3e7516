"""Kimi Delta Attention: the gated delta rule with one decay per key channel (Kimi Linear's linear layers)."""

from __future__ import annotations

from .forms import gated_recurrence, required_beta

__all__ = ["kimi_delta_attention"]


def kimi_delta_attention(q, k, v, g, beta, *, scale=None, normalize_qk: bool = False, form: str = "chunk",
                         chunk_size: int = 16, initial_state=None, cu_seqlens=None,
                         parents=None):
    """KDA: decay each key channel of the state by its own gate, then correct it by the delta rule.

    Kimi Team 2025, "Kimi Linear: An Expressive, Efficient Attention Architecture",
    arXiv:2510.26692 (KDA and its chunkwise form)::

        S_t = (I - beta_t k_t k_t^T) Diag(alpha_t) S_{t-1} + beta_t k_t v_t^T      o_t = S_t^T q_t

    with ``alpha_t = exp(g_t)`` ``(Dk,)``: Gated DeltaNet's scalar gate made per channel, as GLA's.
    The block terms use the decayed products ``sum_d k_id k_jd exp(seg_ijd)`` (see
    :mod:`attnkit.functional.recurrences.local`).

    Differences from the paper: none (``normalize_qk`` and ``scale`` as :func:`delta_rule`; ``beta`` in
    ``[0, 2]`` for negative eigenvalues, as there). The
    blocks' decayed products are computed without their ``c x c x Dk`` decay masks
    (:func:`attnkit.functional.recurrences.local.split_decayed_products`), so ``chunk_size`` 16 to 128 cost
    about the same.

    Shapes: as :func:`attnkit.functional.recurrences.delta_rule`, with ``g`` ``(B, H, L, Dk)``. Matches
    transformers' ``chunk_kimi_delta_attention`` after moving its ``(B, L, H, D)`` tensors to
    ``(B, H, L, D)``.

    Complexity: parallel O(L^2 Dk + L^2 Dv + L^3); chunk O(L c Dk + L c Dv + L Dk Dv); recurrent
    O(L Dk Dv).

    Args:
        q, k, v: queries, keys, values.
        g: log decay per token, head and key channel.
        beta: writing strength per token and head.
        scale, normalize_qk, form, chunk_size, initial_state, cu_seqlens, parents: as :func:`delta_rule`.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> _ = torch.manual_seed(0)
        >>> inputs = [torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 3),
        ...           F.logsigmoid(torch.randn(1, 2, 9, 4)), torch.rand(1, 2, 9)]
        >>> packed, states = kimi_delta_attention(*inputs, normalize_qk=True, cu_seqlens=torch.tensor([0, 4, 9]))
        >>> alone, _ = kimi_delta_attention(*(t[:, :, 4:] for t in inputs), normalize_qk=True, form="parallel")
        >>> states.shape, torch.allclose(packed[:, :, 4:], alone, atol=1e-5)  # two documents, each from zeros
        (torch.Size([2, 2, 4, 3]), True)
    """
    return gated_recurrence("kimi_delta_attention", q, k, v, g, required_beta("kimi_delta_attention", beta),
                            per_channel=True, scale=scale, normalize_qk=normalize_qk, form=form, chunk_size=chunk_size,
                            initial_state=initial_state, cu_seqlens=cu_seqlens, parents=parents)
