"""Gated DeltaNet: the delta rule with a data-dependent decay per head (Qwen3-Next's linear layers)."""

from __future__ import annotations

from .forms import gated_recurrence, required_beta

__all__ = ["gated_delta_rule"]


def gated_delta_rule(q, k, v, g, beta, *, scale=None, normalize_qk: bool = False, form: str = "chunk",
                     chunk_size: int = 64, initial_state=None, cu_seqlens=None,
                     parents=None):
    """The gated delta rule: decay the state by ``alpha_t = exp(g_t)``, then correct it by the delta rule.

    Yang et al. 2024, "Gated Delta Networks: Improving Mamba2 with Delta Rule", arXiv:2412.06464
    (the gated delta rule and its chunkwise form)::

        S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T      o_t = S_t^T q_t

    (the paper writes ``S`` as ``(Dv, Dk)``, so ``S_{t-1} (I - beta k k^T)``; here ``(Dk, Dv)``).
    Since ``alpha_t`` is a scalar it commutes with the correction, which reads the decayed state.
    ``alpha = 1`` is :func:`attnkit.functional.recurrences.delta_rule`; ``beta = 0`` only decays (Mamba-2).

    Differences from the paper: none (``normalize_qk`` and ``scale`` as :func:`delta_rule`; ``beta`` in
    ``[0, 2]`` for negative eigenvalues, as there).

    Shapes: as :func:`attnkit.functional.recurrences.delta_rule`, with ``g`` ``(B, H, L)`` log decays
    (<= 0). Matches transformers' ``torch_chunk_gated_delta_rule`` (Qwen3-Next) after moving its
    ``(B, L, H, D)`` tensors to ``(B, H, L, D)``.

    Complexity: as :func:`attnkit.functional.recurrences.delta_rule`.

    Args:
        q, k, v: queries, keys, values.
        g: log decay per token and head.
        beta: writing strength per token and head.
        scale, normalize_qk, form, chunk_size, initial_state, cu_seqlens, parents: as :func:`delta_rule`.

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> _ = torch.manual_seed(0)
        >>> inputs = [torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 3),
        ...           F.logsigmoid(torch.randn(1, 2, 9)), torch.rand(1, 2, 9)]
        >>> whole, _ = gated_delta_rule(*inputs, normalize_qk=True, chunk_size=4)
        >>> first, state = gated_delta_rule(*(t[:, :, :5] for t in inputs), normalize_qk=True)
        >>> rest, _ = gated_delta_rule(*(t[:, :, 5:] for t in inputs), normalize_qk=True, initial_state=state,
        ...                            form="recurrent")  # decoding continues from the state
        >>> torch.allclose(torch.cat([first, rest], 2), whole, atol=1e-5)
        True
    """
    return gated_recurrence("gated_delta_rule", q, k, v, g, required_beta("gated_delta_rule", beta), scale=scale,
                            normalize_qk=normalize_qk, form=form, chunk_size=chunk_size, initial_state=initial_state,
                            cu_seqlens=cu_seqlens, parents=parents)
