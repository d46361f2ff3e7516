"""PaTH attention: positions encoded by accumulated Householder-like transformations, in parallel form.

Yang et al. 2025, "PaTH Attention: Position Encoding via Accumulating Householder Transformations",
arXiv:2505.16381. Each token ``t`` has a transformation ``H_t = I - beta_t w_t w_t^T`` (``w_t`` a
unit vector, ``beta_t`` in ``[0, 2]``: a reflection at 2); the score of key ``j`` for query ``i >= j``
reads the key through every transformation in between::

    s_ij = q_i^T H_i H_{i-1} ... H_{j+1} k_j          (s_ii = q_i^T k_i)
    o_i  = sum_{j <= i} softmax_j(scale s_ij + F_i - F_j) v_j

with, optionally, FoX's forget-gate bias ``F_i - F_j`` (``F`` the running sum of log forget gates;
the paper's PaTH-FoX). RoPE is the special case of fixed rotations; here the transformations
depend on the data.

Parallel form: the products of ``H`` collapse, as in the delta rule's UT transform, to
``S = tril(Q K^T) - tril(Q W^T) T^-1 tril_-1(diag(beta) W K^T)`` with the unit lower triangular
``T = I + tril_-1(diag(beta) W W^T)`` (``tril_-1`` the part strictly below the diagonal): one
triangular solve, O(L^2 (D + Dv) + L^3) time, O(L^2) memory, gradients by autograd.
"""

from __future__ import annotations

import torch

from ..errors import DeviceError, DTypeError, ShapeError
from .forgetting import ForgetGateBias

__all__ = ["path_scores", "path_attention"]


def _floating(who: str, name: str, t, shape: tuple, dims: str, device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise DTypeError(f"{who}: {name} must be a floating tensor; got "
                         f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
    if tuple(t.shape) != tuple(shape):
        raise ShapeError(f"{who}: {name} must have shape {dims} = {tuple(shape)}; got {tuple(t.shape)}")
    if t.device != device:
        raise DeviceError(f"{who}: {name} must be on q's device {device}; got {t.device}")
    return t


def path_scores(q, k, w, beta):
    """The unscaled PaTH scores ``s_ij`` ``(..., L, L)`` (zero above the diagonal) of ``q, k, w`` ``(..., L, D)`` and
    ``beta`` ``(..., L)``, in the parallel form of the module docstring."""
    wb = w * beta[..., None]
    below = torch.ones(q.shape[-2], q.shape[-2], dtype=torch.bool, device=q.device).tril(-1)
    t = (wb @ w.transpose(-1, -2)) * below
    t = t + torch.eye(q.shape[-2], dtype=q.dtype, device=q.device)
    written = (wb @ k.transpose(-1, -2)) * below  # beta_m w_m^T k_j for m > j
    through = torch.linalg.solve_triangular(t, written, upper=False, unitriangular=True)
    return (q @ k.transpose(-1, -2)).tril() - (q @ w.transpose(-1, -2)).tril() @ through


def path_attention(q, k, v, w, beta, *, log_fgate=None, scale=None):
    """Causal PaTH attention (module docstring), parallel form, differentiable in every input.

    Shapes: ``q`` ``(B, H, L, D)``; ``k, w`` ``(B, Hkv, L, D)``, ``v`` ``(B, Hkv, L, Dv)``, ``beta``
    ``(B, Hkv, L)`` (``H`` a multiple of ``Hkv``: each key head, with its transformations, serves
    ``H / Hkv`` consecutive query heads); ``log_fgate`` ``(B, H, L)`` or None -> ``(B, H, L, Dv)``.
    ``w`` is used as given (the paper normalises it: ``H_t`` is then a reflection at ``beta_t = 2``).
    Computed in float32 (float64 for float64 inputs); ``scale`` defaults to ``D^-1/2``.

    Complexity: O(B H (L^2 (D + Dv) + L^3)) time, O(B H L^2) memory.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> q, k, v, w = torch.randn(4, 1, 2, 6, 4).unbind(0)
        >>> out = path_attention(q, k, v, w, torch.zeros(1, 2, 6))  # beta = 0: every H_t = I
        >>> plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> torch.allclose(out, plain, atol=1e-6)
        True
    """
    who = "path_attention"
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise ShapeError(f"{who}: q must be a tensor of shape (B, H, L, D); got "
                         f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
    b, h, n, d = q.shape
    _floating(who, "q", q, q.shape, "(B, H, L, D)", q.device)
    hkv = k.shape[1] if isinstance(k, torch.Tensor) and k.dim() == 4 else -1
    if hkv < 1 or h % hkv:
        raise ShapeError(f"{who}: k must have shape (B, Hkv, L, D) with H = {h} a multiple of Hkv; got "
                         f"{tuple(k.shape) if isinstance(k, torch.Tensor) else type(k).__name__}")
    _floating(who, "k", k, (b, hkv, n, d), "(B, Hkv, L, D)", q.device)
    _floating(who, "w", w, (b, hkv, n, d), "(B, Hkv, L, D)", q.device)
    _floating(who, "v", v, (b, hkv, n, v.shape[-1] if isinstance(v, torch.Tensor) else 0), "(B, Hkv, L, Dv)",
              q.device)
    _floating(who, "beta", beta, (b, hkv, n), "(B, Hkv, L)", q.device)
    if log_fgate is not None:
        _floating(who, "log_fgate", log_fgate, (b, h, n), "(B, H, L)", q.device)
    acc = torch.promote_types(q.dtype, torch.float32)
    k, v, w, beta = (t.to(acc).repeat_interleave(h // hkv, 1) for t in (k, v, w, beta))
    scores = path_scores(q.to(acc), k, w, beta) * (d ** -0.5 if scale is None else scale)
    if log_fgate is not None:
        index = torch.arange(n, device=q.device)
        bias = ForgetGateBias(log_fgate.to(acc).cumsum(-1))
        scores = scores + bias.term(torch.arange(b, device=q.device).view(-1, 1, 1, 1),
                                    torch.arange(h, device=q.device).view(-1, 1, 1), index.view(-1, 1), index, n, n)
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    return (weights @ v).to(q.dtype)
