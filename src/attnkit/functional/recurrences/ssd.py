"""Mamba-2's state space duality: a selective SSM with a scalar decay per head is a masked attention."""

from __future__ import annotations

import torch

from .forms import check_qkv, check_tensor, linear_recurrence

__all__ = ["ssd", "ssd_inputs"]


def ssd(x, dt, A, B, C, *, D=None, form: str = "chunk", chunk_size: int = 64, initial_state=None, cu_seqlens=None,
        out_dtype=None):
    """SSD: the selective state space model whose state matrix is a scalar times the identity, per head.

    Dao & Gu 2024, "Transformers are SSMs", arXiv:2405.21060, Sec. 6 and Listing 1. The recurrence
    ``h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t^T``, ``y_t = h_t^T C_t + D x_t`` equals the masked
    attention (the SSD "dual" form)::

        Y = (L * C B^T) (dt X) + D X,      L = exp(segsum(dt A))   (L_ij = exp(dt_{j+1} A + ... + dt_i A), j <= i)

    so it runs as a decayed linear attention with queries C, keys B, values ``dt x`` and log
    decay ``dt A``, no scaling (:mod:`attnkit.functional.recurrences.forms`).

    Differences from the paper: none. The state is ``(N, P)`` per head (Mamba's code keeps it
    ``(P, N)``: transpose to exchange it).

    Shapes: ``x`` ``(B, H, L, P)``, ``dt`` ``(B, H, L)`` (after the softplus: > 0), ``A`` ``(H,)`` (< 0),
    ``B, C`` ``(B, G, L, N)`` (G groups; head h reads group ``h // (H / G)``), ``D`` ``(H,)`` ->
    ``(y (B, H, L, P), final state (N_docs, H, N, P))``; packed documents as
    :func:`attnkit.functional.recurrences.retention`.

    Complexity: parallel O(L^2 (N + P)); chunk O(L c (N + P) + L N P); recurrent O(L N P).

    Args:
        x: inputs per head.
        dt: step sizes.
        A: decay rate per head.
        B, C: input and output projections of the state (keys and queries).
        D: skip connection per head (none if None).
        form, chunk_size, initial_state, cu_seqlens: as :func:`attnkit.functional.recurrences.retention`.
        out_dtype: the output's dtype (None: x's); the computation's (float32, or float64) keeps ``y`` unrounded
            for what follows (:class:`attnkit.nn.Mamba2Mixer` adds ``D x`` and gates it in float32).

    Example:
        >>> import torch
        >>> import torch.nn.functional as F
        >>> _ = torch.manual_seed(0)
        >>> x, dt = torch.randn(2, 4, 9, 3), F.softplus(torch.randn(2, 4, 9))
        >>> A, B, C = -torch.rand(4), torch.randn(2, 2, 9, 5), torch.randn(2, 2, 9, 5)
        >>> y, state = ssd(x, dt, A, B, C, chunk_size=4)
        >>> y.shape, state.shape
        (torch.Size([2, 4, 9, 3]), torch.Size([2, 4, 5, 3]))
        >>> torch.allclose(y, ssd(x, dt, A, B, C, form="recurrent")[0], atol=1e-5)
        True
    """
    b, h, n, _, _ = check_qkv("ssd", C, B, x, names=("C", "B", "x"))
    check_tensor("ssd", "dt", dt, (b, h, n), "(B, H, L)", x.device)
    check_tensor("ssd", "A", A, (h,), "(H,)", x.device)
    if D is not None:
        check_tensor("ssd", "D", D, (h,), "(H,)", x.device)
    q, k, values, g = ssd_inputs(x, dt, A, B, C)
    y, state = linear_recurrence("ssd", q, k, values, g, None, scale=1.0, normalize_qk=False, form=form,
                                 chunk_size=chunk_size, initial_state=initial_state, cu_seqlens=cu_seqlens)
    if D is not None:
        y = y + x.to(y.dtype) * D.to(y.dtype)[:, None, None]
    return y.to(x.dtype if out_dtype is None else out_dtype), state


def ssd_inputs(x, dt, A, B, C):
    """SSD as a decayed linear attention: queries C, keys B, values ``dt x``, log decays ``dt A`` ``(B, H, L, 1)``;
    in float32 or better (the recurrence computes in it anyway, and ``dt x`` should not round to x's dtype)."""
    acc = torch.promote_types(x.dtype, torch.float32)
    dt = dt.to(acc)
    return C.to(acc), B.to(acc), x.to(acc) * dt[..., None], (dt * A.to(acc)[:, None])[..., None]
