"""Normalise stage: scores ``(..., Lk)`` and a bool ``allowed`` -> weights ``(..., Lk)``.

Masking is by *select* (``masked_fill`` with ``-inf``), never by adding a sentinel,
so NaN/inf in a masked-out score cannot leak and no constant has to fit a dtype.
A row with no allowed key gets all-zero weights and ``lse = -inf``, with finite
gradients (RELIABILITY rows 1-2): the zero-sum division is guarded *before* it
happens rather than patched afterwards. NaN in an allowed score still propagates.
Sigmoid attention, softpick and stick-breaking are written over key blocks in
:mod:`.blockwise`, so that the O(L)-memory paths run them too.
"""

from __future__ import annotations

import torch

from .blockwise import sigmoid, sigmoid_log_n, softpick, stick_breaking

__all__ = ["softmax", "masked_softmax", "guard_empty_rows", "sparsemax", "sigmoid", "sigmoid_log_n", "softpick",
           "stick_breaking", "hard", "gumbel_softmax", "NORMALIZERS"]

_NEG_INF = float("-inf")


def _masked(scores, allowed):
    return scores if allowed is None else scores.masked_fill(~allowed, _NEG_INF)


def guard_empty_rows(m: torch.Tensor, s: torch.Tensor, keyed: torch.Tensor | None = None):
    """``(s_safe, lse)`` for row sums ``s`` of ``exp(scores - m)`` (``m`` finite, keepdim shapes).

    A row with no allowed key has ``s == 0``: ``s_safe`` is 1 there (so dividing
    by it gives 0, and no ``1/0`` reaches a gradient) and ``lse`` is ``-inf``.
    ``s == 0`` is False for NaN rows, so NaN propagates. ``lse`` loses the last dim.
    ``keyed`` (bool, like ``s``), where given, marks the rows the mask leaves a key: such a row with
    ``s == 0`` had every allowed score ``-inf`` from infinite q or k, and keeps ``s = 0``, so its
    output is ``0 / 0 = NaN`` (RELIABILITY row 21; its lse stays ``-inf``, the log of that empty sum).
    """
    empty = s == 0 if keyed is None else (s == 0) & ~keyed
    s_safe = torch.where(empty, torch.ones_like(s), s)
    lse = torch.where(empty, torch.full_like(s, _NEG_INF), m + torch.log(s_safe))
    return s_safe, lse.squeeze(-1)


def softmax(scores: torch.Tensor, allowed: torch.Tensor | None = None, sink: torch.Tensor | None = None):
    """Safe softmax over the last dim. Returns ``(weights, lse)``, lse of shape ``(...)``.

    ``weights_j = exp(s_j - m) / sum_l exp(s_l - m)`` with ``m`` the row max over
    allowed keys; ``lse = m + log sum_l exp(s_l - m)``. A ``sink`` (broadcastable to the
    rows, keepdim: :mod:`attnkit.functional.sinks`) is one more term of every row's sum
    that takes no weight: a row with no allowed key then has lse ``sink``.
    """
    scores = _masked(scores, allowed)
    if scores.shape[-1] == 0 and sink is None:
        return scores, scores.new_full(scores.shape[:-1], _NEG_INF)
    m = scores.amax(-1, keepdim=True) if scores.shape[-1] else scores.new_full((*scores.shape[:-1], 1), _NEG_INF)
    if sink is not None:
        m = torch.maximum(m, sink)
    m = m.masked_fill(m == _NEG_INF, 0).detach()  # shift invariance: m needs no gradient
    e = torch.exp(scores - m)
    total = e.sum(-1, keepdim=True)
    s_safe, lse = guard_empty_rows(m, total if sink is None else total + torch.exp(sink - m))
    return e / s_safe, lse


def masked_softmax(scores: torch.Tensor, allowed: torch.Tensor | None, *, need_lse: bool = True):
    """Fast softmax for scores whose only ``-inf`` entries come from ``allowed``.

    Same result as :func:`softmax` under that condition (so not after an additive
    bias that may hold ``-inf``), with torch's fused softmax: two passes over the
    scores instead of six. Masks ``scores`` in place. Rows with no allowed key are
    set to 0 after the softmax; their NaN gradient stops at the masked_fill below,
    which zeroes the gradient of every masked score. Returns ``(weights, lse or None)``.
    """
    if allowed is not None:
        scores = scores.masked_fill_(~allowed, _NEG_INF)
    if scores.shape[-1] == 0:
        return scores, scores.new_full(scores.shape[:-1], _NEG_INF)
    weights = torch.softmax(scores, dim=-1)
    if allowed is not None:
        has_key = allowed.any(-1, keepdim=True)
        if torch.compiler.is_compiling() or not bool(has_key.all()):
            weights = weights.masked_fill(~has_key, 0.0)
    lse = torch.logsumexp(scores, dim=-1) if need_lse else None
    return weights, lse


def sparsemax(scores: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """Sparsemax (Martins & Astudillo 2016, arXiv:1602.02068, eq. 2): Euclidean projection onto the simplex.

    ``p_j = max(s_j - tau, 0)`` with ``tau`` chosen so the row sums to 1; exact
    zeros are common. Masked keys (``-inf``) never enter the support.
    """
    z = _masked(scores, allowed)
    if z.shape[-1] == 0:
        return z
    zs, _ = torch.sort(z, dim=-1, descending=True)
    ks = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    csum = zs.cumsum(-1)
    in_support = 1 + ks * zs > csum  # a prefix of the sorted row
    k = in_support.sum(-1, keepdim=True)  # support size; 0 only when the row is all masked
    tau_num = csum.gather(-1, (k - 1).clamp(min=0)) - 1
    tau = tau_num / k.clamp(min=1).to(z.dtype)
    p = torch.clamp(z - tau, min=0)
    no_key = (k == 0) & ~torch.isnan(z).any(-1, keepdim=True)  # every score -inf (NaN rows stay NaN)
    return p.masked_fill(no_key, 0.0)


def hard(scores: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """One-hot at the best allowed key (Xu et al. 2015 deterministic hard attention).

    The gradient is the straight-through estimator through the softmax (the
    forward is exactly one-hot; the backward is that of softmax). Ties go to the
    lowest index. A row with no allowed key is all zero.
    """
    soft, _ = softmax(scores, allowed)
    z = _masked(scores, allowed)
    if z.shape[-1] == 0:
        return soft
    idx = z.argmax(-1, keepdim=True)
    one_hot = torch.zeros_like(soft).scatter_(-1, idx, 1.0)
    # A row whose every score is -inf (masked, or biased to -inf) has no best key.
    one_hot = one_hot * (z.amax(-1, keepdim=True) > _NEG_INF)
    return one_hot + (soft - soft.detach())


def gumbel_softmax(scores: torch.Tensor, allowed: torch.Tensor | None = None, *,
                   tau: float = 1.0, hard_sample: bool = False,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """Gumbel-softmax relaxation (Jang et al. 2017, arXiv:1611.01144, eq. 1).

    ``softmax((s + g) / tau)`` with ``g ~ Gumbel(0, 1)`` drawn from ``generator``;
    ``hard_sample=True`` returns the one-hot sample with straight-through gradients.
    """
    if not tau > 0:
        raise ValueError(f"tau must be > 0; got {tau}")
    u = torch.rand(scores.shape, generator=generator, device=scores.device, dtype=scores.dtype)
    g = -torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))
    noisy = (scores + g) / tau
    return hard(noisy, allowed) if hard_sample else softmax(noisy, allowed)[0]


def _softmax_weights(scores, allowed=None):
    return softmax(scores, allowed)[0]


NORMALIZERS = {
    "softmax": _softmax_weights,
    "sparsemax": sparsemax,
    "sigmoid": sigmoid,
    "sigmoid_log_n": sigmoid_log_n,
    "softpick": softpick,
    "stick_breaking": stick_breaking,
    "hard": hard,
    "gumbel": gumbel_softmax,
}
