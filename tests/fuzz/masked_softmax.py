"""A differentiable float64 oracle written from the masked-softmax definition, for forward and gradients.

For one attention call, with ``A`` the allowed pairs (the mask, True = attend)::

    S = scale * score(q, k) + bias            then a modifier, if any: S = f(S, b, h, i, j)
    W[i, j] = exp(S[i, j] - m_i) / sum_{l in A_i} exp(S[i, l] - m_i)   for j in A_i, else 0
    m_i = max_{l in A_i} S[i, l];  a row with no allowed key (A_i empty, or every S -inf) has W = 0
    out = W @ V;  lse_i = m_i + log sum_{l in A_i} exp(S[i, l] - m_i)  (-inf for an empty row)

Except (docs/RELIABILITY.md row 21): where nothing but the mask and the inputs makes a score ``-inf`` (no
bias, modifier or sink) and q or k holds an infinity, a row whose allowed scores are all ``-inf`` attends a
non-finite input: ``0 / 0``, NaN on its allowed keys (lse ``-inf``); a row the mask empties stays 0.

With sinks ``s_h`` (a logit per head), ``exp(s_h - m_i)`` joins every sum of head h and ``m_i`` is the
max of the row and ``s_h``: the sink takes weight and gives no value, and an empty row has lse ``s_h``.

Every score is built at once in float64 from the inputs (upcast, never the library's kernels,
scores, normalisers or validation), so ``torch.autograd.grad`` through it gives the exact gradients
of that definition. Sigmoid weights are ``sigmoid(S)`` on allowed pairs; sigmoid with ``-log n``,
softpick and stick-breaking are written from their papers below. The modifiers it knows are
written from their papers here: ALiBi ``-m_h |i + Lk - Lq - j|`` (bottom-right) or ``-m_h |i - j|``
(top-left), soft-capping ``c tanh(S / c)``, a clipped relative-position table ``w_h[clip(j - i', -K, K)]``.
A mask is read only through ``Mask.materialize``.
"""

from __future__ import annotations

import math

import torch

from attnkit.bias import ALiBi, RelativePositionBias, Softcap
from attnkit.masks import Mask

__all__ = ["attend", "as_4d", "NORMALIZERS"]

_NEG_INF = float("-inf")


def as_4d(t: torch.Tensor) -> torch.Tensor:
    """``(L, D)`` -> ``(1, 1, L, D)``; ``(B, L, D)`` -> ``(B, 1, L, D)``; 4-D unchanged (a view: grads flow)."""
    return t[None, None] if t.dim() == 2 else t[:, None] if t.dim() == 3 else t


def _allowed(mask, user_scores, b, h, lq, lk):
    if mask is None:
        return torch.ones(b, h, lq, lk, dtype=torch.bool)
    if isinstance(mask, Mask):
        return torch.broadcast_to(mask.materialize(lq, lk, batch=b, heads=h), (b, h, lq, lk))
    return torch.broadcast_to(as_4d(torch.broadcast_to(mask, user_scores)), (b, h, lq, lk))


def _modified(modifier, s, lq, lk):
    h = torch.arange(s.shape[1]).view(1, -1, 1, 1)
    i, j = torch.arange(lq).view(1, 1, -1, 1), torch.arange(lk).view(1, 1, 1, -1)
    if isinstance(modifier, Softcap):
        return modifier.cap * torch.tanh(s / modifier.cap)
    if isinstance(modifier, ALiBi):
        shift = lk - lq if modifier.align == "bottom_right" else 0
        return s - modifier.slopes.to(s.dtype)[h] * (i + shift - j).abs()
    if isinstance(modifier, RelativePositionBias) and modifier.mode == "clip":  # Shaw et al. 2018, eq. 3-4
        shift = lk - lq if modifier.align == "bottom_right" else 0
        far = modifier.max_distance
        return s + modifier.table.to(s.dtype)[h, (j - i - shift).clamp(-far, far) + far]
    raise NotImplementedError(f"masked_softmax oracle: modifier {modifier!r}")


def attend(q, k, v, *, mask=None, bias=None, score="scaled_dot", scale=None, normalize="softmax",
           sinks=None, dtype=torch.float64):
    """``(out, lse or None)`` computed in ``dtype`` (float64: the oracle; float32: the plain same-dtype
    implementation the tolerances compare with), differentiable in q, k, v, a tensor bias and the sinks; out has
    q's rank."""
    rank = q.dim()
    user_scores = (*q.shape[:-1], k.shape[-2])
    q, k, v = (as_4d(t).to(dtype) for t in (q, k, v))
    b, h, lq, d = q.shape
    lk = k.shape[2]
    if k.shape[1] not in (0, h):  # grouped queries: query head h reads key/value head h // group
        k, v = (t.repeat_interleave(h // k.shape[1], dim=1) for t in (k, v))
    if scale is None:
        scale = 1.0 / math.sqrt(d) if score == "scaled_dot" and d else 1.0
    if score == "cosine":
        q = q / torch.linalg.vector_norm(q, dim=-1, keepdim=True).clamp_min(1e-6)
        k = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True).clamp_min(1e-6)
    s = (q @ k.transpose(-1, -2)) * scale  # (B, H, Lq, Lk)
    if isinstance(bias, torch.Tensor):
        s = s + torch.broadcast_to(as_4d(torch.broadcast_to(bias.to(dtype), user_scores)), s.shape)
    elif bias is not None:
        s = _modified(bias, s, lq, lk)
    allowed = _allowed(mask, user_scores, b, h, lq, lk)
    if normalize in _ELEMENTWISE:
        weights, lse = _ELEMENTWISE[normalize](s, allowed), None
    elif normalize == "softmax" and bias is None and sinks is None and not (q.isfinite().all() and k.isfinite().all()):
        weights, lse = _softmax_of_infinities(s, allowed)
    elif normalize == "softmax":
        weights, lse = _softmax(s, allowed, None if sinks is None else sinks.to(dtype))
    else:
        raise NotImplementedError(f"masked_softmax oracle: normalize {normalize!r}")
    out = weights @ v
    back = (lambda t: t[0, 0]) if rank == 2 else (lambda t: t[:, 0]) if rank == 3 else (lambda t: t)
    return back(out), (back(lse) if lse is not None else None)


def _sigmoid_log_n(s, allowed):
    """Ramapuram et al. 2024 (arXiv:2409.04431): ``sigmoid(S - log n)``, ``n`` the row's keys (allowed or not)."""
    return torch.sigmoid(s - math.log(max(s.shape[-1], 1))).masked_fill(~allowed, 0.0)


def _softpick(s, allowed):
    """Zuhri et al. 2025 (arXiv:2504.20966): ``ReLU(e^S - 1) / (sum_allowed |e^S - 1| + 1e-8)``."""
    e = torch.where(allowed, torch.expm1(s.masked_fill(~allowed, 0.0)), torch.zeros_like(s))
    return torch.relu(e) / (e.abs().sum(-1, keepdim=True) + 1e-8)


def _stick_breaking(s, allowed):
    """Tan et al. 2024 (arXiv:2410.17980): ``beta_j prod_{l > j allowed} (1 - beta_l)``, ``beta = sigmoid(S)``,
    in logs: ``log w_j = log sigmoid(S_j) + sum_{l > j allowed} log sigmoid(-S_l)``."""
    s0 = s.masked_fill(~allowed, 0.0)
    later = torch.nn.functional.logsigmoid(-s0).masked_fill(~allowed, 0.0)
    after = later.flip(-1).cumsum(-1).flip(-1) - later  # the sum over allowed l > j
    return torch.exp(torch.nn.functional.logsigmoid(s0) + after).masked_fill(~allowed, 0.0)


_ELEMENTWISE = {"sigmoid": lambda s, allowed: torch.sigmoid(s).masked_fill(~allowed, 0.0),
                "sigmoid_log_n": _sigmoid_log_n, "softpick": _softpick, "stick_breaking": _stick_breaking}
NORMALIZERS = ("softmax", *_ELEMENTWISE)


def _softmax_of_infinities(s, allowed):
    """Row 21: torch's softmax over the allowed keys (NaN on a row of ``-inf`` scores), a masked key's weight 0
    by select (so a row the mask empties is 0 and its gradient stops at ``masked_fill``)."""
    s = s.masked_fill(~allowed, _NEG_INF)
    weights = torch.where(allowed, torch.softmax(s, -1), torch.zeros_like(s))
    lse = torch.logsumexp(s, -1) if s.shape[-1] else s.new_full(s.shape[:-1], _NEG_INF)
    return weights, lse


def _softmax(s, allowed, sinks=None):
    """Over allowed keys; sinks add ``exp(sink_h - m)`` to every row's sum of head h (``m`` includes it)."""
    s = s.masked_fill(~allowed, _NEG_INF)
    m = s.amax(-1, keepdim=True).detach() if s.shape[-1] else s.new_full((*s.shape[:-1], 1), _NEG_INF)
    sink = None if sinks is None else torch.broadcast_to(sinks, s.shape[:2])[:, :, None, None]
    if sink is not None:
        m = torch.maximum(m, sink.detach())
    empty = m == _NEG_INF
    e = torch.exp(s - torch.where(empty, torch.zeros_like(m), m))
    total = e.sum(-1, keepdim=True)
    if sink is not None:
        total = total + torch.exp(sink - torch.where(empty, torch.zeros_like(m), m))
        empty = total == 0  # a sink of -inf and no allowed key
    weights = torch.where(empty, torch.zeros_like(e), e / torch.where(empty, torch.ones_like(total), total))
    lse = torch.where(empty, torch.full_like(m, _NEG_INF), m + torch.log(torch.where(empty, torch.ones_like(total),
                                                                                       total)))
    return weights, lse.squeeze(-1)
