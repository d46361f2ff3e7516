"""DeltaNet: linear attention whose state is corrected by the delta rule instead of only added to."""

from __future__ import annotations

from .forms import gated_recurrence, required_beta

__all__ = ["delta_rule"]

_required = required_beta  # the name comba.py imports it by (the check lives in forms.py)


def delta_rule(q, k, v, beta, *, scale=None, normalize_qk: bool = False, form: str = "chunk", chunk_size: int = 64,
               initial_state=None, cu_seqlens=None,
               parents=None):
    """The delta rule: each token replaces what the state recalls for its key by its value, at rate beta.

    Schlag et al. 2021, "Linear Transformers Are Secretly Fast Weight Programmers",
    arXiv:2102.11174; chunkwise form of Yang et al. 2024, "Parallelizing Linear
    Transformers with the Delta Rule over Sequence Length", arXiv:2406.06484::

        S_t = S_{t-1} - beta_t k_t (k_t^T S_{t-1} - v_t^T)      o_t = S_t^T q_t

    i.e. ``S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``. Parallel form:
    ``O = (Q K^T * M) (I + tril(diag(beta) K K^T, -1))^-1 diag(beta) V`` (M the causal mask).
    Notation: the paper's ``S`` is ``(Dv, Dk)``; here it is transposed, ``(Dk, Dv)``.

    Differences from the paper: none in the function (``normalize_qk`` divides q and k by their
    L2 norms, as the paper's model does: with ``|k| = 1`` and ``0 <= beta <= 1`` the transition's
    eigenvalues stay in [0, 1]); q is scaled by ``scale`` (``Dk^-1/2`` by default).

    Negative eigenvalues: every form takes any ``beta``. With ``|k| = 1`` the eigenvalue along ``k``
    is ``1 - beta``, so ``beta`` in ``[0, 2]`` puts it in ``[-1, 1]``: ``beta = 2`` reflects the state
    (``I - 2 k k^T``), which lets the recurrence track state such as parity, impossible with
    eigenvalues in ``[0, 1]`` (Grazzi et al. 2025, "Unlocking State-Tracking in Linear RNNs Through
    Negative Eigenvalues", arXiv:2411.12537; the layers' ``allow_neg_eigval``).

    Shapes: as :func:`attnkit.functional.recurrences.retention`, with ``beta`` ``(B, H, L)``.

    Complexity: parallel O(L^2 (Dk + Dv) + L^3) (the triangular solve); chunk O(L c (c + Dk + Dv) +
    L Dk Dv); recurrent O(L Dk Dv).

    Args:
        q, k, v: queries, keys, values.
        beta: writing strength per token and head (in [0, 1] in the paper: a sigmoid; [0, 2] for negative
            eigenvalues).
        scale: multiplies q after the normalisation (default ``Dk ** -0.5``).
        normalize_qk: L2-normalise q and k first.
        form, chunk_size, initial_state, cu_seqlens: as :func:`attnkit.functional.recurrences.retention`.
        parents: the tokens are a speculative draft tree (:func:`attnkit.masks.tree`'s parents), each run from its
            parent's state; the second result is every node's state ``(B, H, L, Dk, Dv)``
            (:mod:`attnkit.functional.recurrences.tree`).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 6)
        >>> beta = torch.rand(2, 3, 5)
        >>> out, state = delta_rule(q, k, v, beta, normalize_qk=True, chunk_size=2)
        >>> torch.allclose(out, delta_rule(q, k, v, beta, normalize_qk=True, form="recurrent")[0], atol=1e-5)
        True
    """
    return gated_recurrence("delta_rule", q, k, v, None, required_beta("delta_rule", beta), scale=scale,
                            normalize_qk=normalize_qk, form=form, chunk_size=chunk_size, initial_state=initial_state,
                            cu_seqlens=cu_seqlens, parents=parents)
