"""PaTH attention: positions encoded by accumulated Householder-like transformations, parallel and chunk forms.

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

Chunk form (the paper's Sec. 3, blockwise with the UT transform per block): cut the sequence into
blocks of ``c`` positions; block ``b`` (local rows ``W_b``, ``diag(beta_b)``, ``T_b`` as above) has the
accumulated transformation ``P_b = H_{e-1} ... H_s = I - W_b^T T_b^-1 diag(beta_b) W_b``. For a query
``i`` in block ``a`` and a key ``j`` in an earlier block ``b``::

    s_ij = q~_i^T P_{a-1} ... P_{b+1} k^_j,   q~_i^T = q_i^T H_i ... H_{s_a},   k^_j = H_{e_b - 1} ... H_{j+1} k_j

where, with ``M_b = T_b^-1 diag(beta_b) W_b`` and ``Y_b = T_b^-1 tril_-1(diag(beta_b) W_b K_b^T)``,
``Q~_a = Q_a - tril(Q_a W_a^T) M_a`` and ``K^_b = K_b - Y_b^T W_b``; the diagonal block is the
parallel form inside the block, ``tril(Q_a K_a^T) - tril(Q_a W_a^T) Y_a``. Each query block walks
the key blocks back from the diagonal, moving its queries by one block's transformation at a time
(``Q <- Q - (Q W_b^T) M_b``, the row form of ``Q P_b``) and accumulating an online softmax (running
max and sum). O(L^2 (D + Dv) + L c (c + D)) time, O(L (c + D + Dv)) memory; each query block's walk
is one autograd node that keeps only its inputs and recomputes the walk in its backward, so the
backward is O(L) in memory too (and the graph has L / c nodes for the walks, not (L / c)^2 / 2).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ArgumentError, DeviceError, DTypeError, ShapeError, check_int
from .forgetting import ForgetGateBias

__all__ = ["path_scores", "path_attention", "choose_form", "FORMS", "CHUNK_FROM"]


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


def _chunk_form(q, k, v, w, beta, fcum, scale: float, c: int) -> torch.Tensor:
    """The chunk form (module docstring) of ``q`` ``(B, H, L, D)``, ``k, w`` ``(B, Hkv, L, D)``, ``v`` ``(B, Hkv, L,
    Dv)``, ``beta`` ``(B, Hkv, L)`` and cumulative gates ``fcum`` ``(B, H, L)`` or None, all in one float dtype."""
    b, h, n, d = q.shape
    if n == 0:
        return v.new_zeros(b, h, 0, v.shape[-1])
    hkv, groups, nb = k.shape[1], h // k.shape[1], -(-n // c)
    pad = nb * c - n  # padded positions: zero keys, H = I, after every real query (never seen by one)
    q, k, v, w = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v, w))
    beta = F.pad(beta, (0, pad))
    q = q.unflatten(1, (hkv, groups)).unflatten(-2, (nb, c))  # (B, Hkv, G, nb, c, D): a key head's query heads
    k, v, w = (t.unflatten(-2, (nb, c))[:, :, None] for t in (k, v, w))  # (B, Hkv, 1, nb, c, *)
    beta = beta.unflatten(-1, (nb, c))[:, :, None, :, :, None]
    eye = torch.eye(c, dtype=q.dtype, device=q.device)
    below = eye.new_ones(c, c).tril(-1)
    wb = w * beta
    t = (wb @ w.transpose(-1, -2)) * below + eye
    written = (wb @ k.transpose(-1, -2)) * below  # beta_m w_m^T k_j for m > j in the block
    m, y = torch.linalg.solve_triangular(t, torch.cat([wb, written], -1), upper=False,
                                         unitriangular=True).split([d, c], -1)
    khat = k - y.transpose(-1, -2) @ w  # each key moved to its block's end
    qw = (q @ w.transpose(-1, -2)).tril()
    qt = q - qw @ m  # each query moved back to its block's start
    diag = ((q @ k.transpose(-1, -2)).tril() - qw @ y) * scale  # (B, Hkv, G, nb, c, c)
    f = None
    if fcum is not None:
        f = F.pad(fcum, (0, pad), mode="replicate").unflatten(1, (hkv, groups)).unflatten(-1, (nb, c))
        diag = diag + f[..., :, None] - f[..., None, :]
    diag = diag.masked_fill(~torch.ones(c, c, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in (qt, diag, khat, v))
    out = [_Row.apply(a, scale, qa, sa, khat, w, m, v, f) if grad else _walk(a, scale, qa, sa, khat, w, m, v, f)
           for a, (qa, sa) in enumerate(zip(qt.unbind(-3), diag.unbind(-3), strict=True))]
    return torch.stack(out, -3).flatten(-3, -2)[..., :n, :].flatten(1, 2)  # (B, H, L, Dv)


def _walk(a: int, scale: float, cur, scores, khat, w, m, v, f) -> torch.Tensor:
    """Query block ``a`` of the chunk form: its diagonal ``scores`` ``(B, Hkv, G, c, c)``, then key blocks ``a - 1,
    ..., 0`` of ``khat, w, m, v`` ``(B, Hkv, 1, nb, c, *)`` with ``cur`` ``(B, Hkv, G, c, D)`` moved back one block at
    a time; an online softmax (running max and sum) -> ``(B, Hkv, G, c, Dv)``."""
    khat, w, m, v = (t.unbind(-3) for t in (khat, w, m, v))  # per block: one stack in the backward
    gates = f.unbind(-2) if f is not None else None
    top = scores.amax(-1, keepdim=True).detach()  # the result does not depend on the running max
    p = (scores - top).exp()
    total, acc = p.sum(-1, keepdim=True), p @ v[a]
    for j in range(a - 1, -1, -1):
        s = (cur @ khat[j].transpose(-1, -2)) * scale
        if gates is not None:
            s = s + gates[a][..., :, None] - gates[j][..., None, :]
        new = torch.maximum(top, s.amax(-1, keepdim=True).detach())
        p, alpha = (s - new).exp(), (top - new).exp()
        total, acc, top = total * alpha + p.sum(-1, keepdim=True), acc * alpha + p @ v[j], new
        if j:
            cur = cur - (cur @ w[j].transpose(-1, -2)) @ m[j]  # cur P_j: through block j to its start
    return acc / total


class _Row(torch.autograd.Function):
    """:func:`_walk` as one autograd node that keeps only its inputs and recomputes the walk in its backward."""

    @staticmethod
    def forward(ctx, a, scale, cur, scores, khat, w, m, v, f):
        ctx.a, ctx.scale = a, scale
        ctx.save_for_backward(cur, scores, khat, w, m, v, f)
        return _walk(a, scale, cur, scores, khat, w, m, v, f)

    @staticmethod
    def backward(ctx, grad):
        inputs = [t.detach().requires_grad_() if t is not None else None for t in ctx.saved_tensors]
        with torch.enable_grad():
            out = _walk(ctx.a, ctx.scale, *inputs)
        found = iter(torch.autograd.grad(out, [t for t in inputs if t is not None], grad, allow_unused=True))
        return (None, None, *(next(found) if t is not None else None for t in inputs))


FORMS = ("auto", "parallel", "chunk")
# form="auto": the chunk form from this length on. Measured with benchmarks/path_forms.py (forward + backward,
# B = 1, H = 4, D = 64, float32, forget gate, chunk 64, 1 thread, two runs on a busy machine): chunk / parallel
# time 2.0 at L = 32, 1.4 at 64, 1.0-1.45 at 128, 1.32 at 160, 0.77-0.79 at 192, 0.75-0.76 at 256, 0.24 at 1024,
# 0.10 at 4096.
CHUNK_FROM = 192


def choose_form(who: str, form: str, length: int) -> str:
    """The form that runs: ``form`` as given, or for ``"auto"`` ``"chunk"`` when ``length >= CHUNK_FROM`` (192),
    else ``"parallel"``; an :class:`~attnkit.errors.ArgumentError` for any other value."""
    if form not in FORMS:
        raise ArgumentError(f"{who}: form must be 'auto', 'parallel' or 'chunk'; got {form!r}")
    if form != "auto":
        return form
    return "chunk" if length >= CHUNK_FROM else "parallel"


def path_attention(q, k, v, w, beta, *, log_fgate=None, scale=None, form: str = "auto", chunk_size: int = 64):
    """Causal PaTH attention (module docstring), parallel or chunk form, differentiable in every input.

    Shapes: ``q`` ``(B, H, L, D)``; ``k, w`` ``(B, Hkv, L, D)``, ``v`` ``(B, Hkv, L, Dv)``, ``beta``
    ``(B, Hkv, L)`` (``H`` a multiple of ``Hkv``: each key head, with its transformations, serves
    ``H / Hkv`` consecutive query heads); ``log_fgate`` ``(B, H, L)`` or None -> ``(B, H, L, Dv)``.
    ``w`` is used as given (the paper normalises it: ``H_t`` is then a reflection at ``beta_t = 2``).
    Computed in float32 (float64 for float64 inputs); ``scale`` defaults to ``D^-1/2``.

    ``form="parallel"``: O(B H (L^2 (D + Dv) + L^3)) time, O(B H L^2) memory.
    ``form="chunk"``: blocks of ``chunk_size`` positions, O(B H (L^2 (D + Dv) + L c (c + D))) time and
    O(B H L (c + D + Dv)) memory, forward and backward (the backward recomputes one query block at a
    time); equal to the parallel form up to rounding.
    ``form="auto"`` (default): the chunk form from ``L >= 192`` (:data:`CHUNK_FROM`), else the parallel
    form. Forward + backward at 1 thread (``benchmarks/path_forms.py``, chunk 64), the chunk form takes
    1.0-1.4x the parallel form's time at L = 128, 1.3x at 160, 0.77-0.79x at 192, 0.76x at 256, 0.24x at
    1024, 0.10x at 4096.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> q, k, v, w = torch.randn(4, 1, 2, 6, 4).unbind(0)
        >>> out = path_attention(q, k, v, w, torch.zeros(1, 2, 6))  # beta = 0: every H_t = I
        >>> plain = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        >>> torch.allclose(out, plain, atol=1e-6)
        True
        >>> beta = torch.rand(1, 2, 6) * 2
        >>> chunk = path_attention(q, k, v, w, beta, form="chunk", chunk_size=4)  # blocks of 4: O(L 4) memory
        >>> torch.allclose(chunk, path_attention(q, k, v, w, beta), atol=1e-6)
        True
    """
    who = "path_attention"
    choose_form(who, form, 0)
    check_int(who, "chunk_size", chunk_size, 1)
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
    scale = d ** -0.5 if scale is None else scale
    if choose_form(who, form, n) == "chunk":
        fcum = None if log_fgate is None else log_fgate.to(acc).cumsum(-1)
        return _chunk_form(q.to(acc), k.to(acc), v.to(acc), w.to(acc), beta.to(acc), fcum, scale,
                           chunk_size).to(q.dtype)
    k, v, w, beta = (t.to(acc).repeat_interleave(h // hkv, 1) for t in (k, v, w, beta))
    scores = path_scores(q.to(acc), k, w, beta) * scale
    if log_fgate is not None:
        index = torch.arange(n, device=q.device)
        bias = ForgetGateBias(log_fgate.to(acc).cumsum(-1))
        scores = scores + bias.term(torch.arange(b, device=q.device).view(-1, 1, 1, 1),
                                    torch.arange(h, device=q.device).view(-1, 1, 1), index.view(-1, 1), index, n, n)
    causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    weights = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    return (weights @ v).to(q.dtype)
