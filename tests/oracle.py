"""An independent dense attention in plain torch ops: the default oracle of the tests.

:func:`dense_attention` computes what ``attnkit.attention`` documents (its docstring and
docs/DESIGN.md section 3) without importing any of the library's kernels, score,
normalise, validation or masking code: every ``(B, H, Lq, Lk)`` score is built at
once, in the dtype asked for (float64 for the oracle). It reads attnkit objects only
through their public contracts: a :class:`~attnkit.masks.Mask` through
``mask.materialize`` (which only evaluates the mask's predicate) and a
:class:`~attnkit.bias.ScoreModifier` through ``modify`` (its lengths-aware entry).

The pipeline, as documented::

    score(q, k) * scale -> + bias tensor -> modifier(scores, b, h, q_idx, kv_idx) -> mask (select)
    -> normalise (a row with no allowed key: weights 0, lse -inf; sinks: one more column, dropped) -> @ v

Arguments it does not model (dropout, "gumbel", which are random) raise.
"""

from __future__ import annotations

import contextlib
import math
from typing import NamedTuple

import torch

from attnkit.bias import ScoreModifier
from attnkit.masks import Mask

__all__ = ["OracleOutput", "dense_attention"]

_NEG_INF = float("-inf")


class OracleOutput(NamedTuple):
    """The fields of ``attnkit.AttentionOutput``; those not asked for are None."""

    output: torch.Tensor
    weights: torch.Tensor | None
    lse: torch.Tensor | None


def _to_4d(t: torch.Tensor) -> torch.Tensor:
    """(L, D) -> (1, 1, L, D); (B, L, D) -> (B, 1, L, D); 4-D unchanged."""
    if t.dim() == 2:
        return t[None, None]
    if t.dim() == 3:
        return t[:, None]
    return t


def _from_4d(t: torch.Tensor, rank: int) -> torch.Tensor:
    """Undo :func:`_to_4d` on a result whose first two dims are (B, H)."""
    if rank == 2:
        return t[0, 0]
    if rank == 3:
        return t[:, 0]
    return t


def _scores_picture(t: torch.Tensor, user_scores: tuple[int, ...]) -> torch.Tensor:
    """A mask or bias tensor broadcast right-aligned to the user-rank scores, then made 4-D."""
    return _to_4d(torch.broadcast_to(t, user_scores))


def _score(score, q, k):
    if score in ("dot", "scaled_dot"):
        return torch.einsum("bhid,bhjd->bhij", q, k)
    if score == "cosine":  # q / max(|q|, eps), as documented for attnkit.functional.scores.cosine (eps 1e-6)
        qn = q / torch.linalg.vector_norm(q, dim=-1, keepdim=True).clamp_min(1e-6)
        kn = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True).clamp_min(1e-6)
        return torch.einsum("bhid,bhjd->bhij", qn, kn)
    if callable(score):
        return score(q, k)
    raise NotImplementedError(f"oracle: score {score!r}")


def _softmax(scores, allowed):
    """``(weights, lse)``: safe softmax over allowed keys; a row with none gets weights 0 and lse -inf."""
    s = scores.masked_fill(~allowed, _NEG_INF)
    m = s.amax(-1, keepdim=True) if s.shape[-1] else s.new_full((*s.shape[:-1], 1), _NEG_INF)
    empty = m == _NEG_INF  # every key masked or -inf (NaN rows are not empty: NaN propagates)
    shift = torch.where(empty, torch.zeros_like(m), m)
    e = torch.exp(s - shift)
    # Guarded so that no branch an empty row does not take divides by or takes the log of 0: autograd sends
    # zeros through the branch torch.where leaves, and 0 * inf would be NaN (a -inf sink's gradient).
    total = torch.where(empty, torch.ones_like(m), e.sum(-1, keepdim=True))
    weights = torch.where(empty, torch.zeros_like(e), e / total)
    lse = torch.where(empty, torch.full_like(m, _NEG_INF), shift + torch.log(total))
    return weights, lse.squeeze(-1)


def _sparsemax(scores, allowed):
    """Euclidean projection of each row onto the simplex (Martins & Astudillo 2016), over allowed keys.

    The threshold ``tau`` with ``sum max(z - tau, 0) = 1`` is bracketed by bisection in
    ``[max - 1, max]``, then recomputed exactly from the support ``z > tau``: not the
    library's sort-and-cumsum. A row with no allowed key is 0; NaN in a row propagates.
    """
    z = scores.masked_fill(~allowed, _NEG_INF)
    if z.shape[-1] == 0:
        return z
    top = z.amax(-1, keepdim=True)
    empty = top == _NEG_INF
    top = torch.where(empty, torch.zeros_like(top), top)
    lo, hi = top - 1, top  # sum max(z - (top - 1), 0) >= 1 and sum max(z - top, 0) = 0
    for _ in range(80):
        mid = (lo + hi) / 2
        above = (z - mid).clamp_min(0).sum(-1, keepdim=True) > 1
        lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
    support = z > lo
    size = support.sum(-1, keepdim=True).clamp_min(1)
    tau = (torch.where(support, z, torch.zeros_like(z)).sum(-1, keepdim=True) - 1) / size
    weights = (z - tau).clamp_min(0)
    return torch.where(empty, torch.zeros_like(weights), weights)


def _hard(scores, allowed):
    """One-hot at the first allowed key with the largest score; 0 for a row with no finite allowed score."""
    s = scores.masked_fill(~allowed, _NEG_INF)
    out = torch.zeros_like(s)
    if s.shape[-1] == 0:
        return out
    best = s.amax(-1, keepdim=True)
    first = torch.arange(s.shape[-1], device=s.device).expand_as(s).masked_fill(s != best, s.shape[-1]).amin(-1)
    has = best.squeeze(-1) > _NEG_INF
    out.scatter_(-1, first.clamp(max=s.shape[-1] - 1).unsqueeze(-1), 1.0)
    return out * has.unsqueeze(-1)


def _sink_softmax(scores, allowed, sinks):
    """Softmax over each row and one more column, the head's sink, which is always allowed and then dropped:
    ``softmax([S, s])[:-1]``; lse includes the sink (a row with no allowed key has lse ``s``)."""
    batch, heads, rows = scores.shape[:3]
    if sinks.dim() == 3:  # (B, H, Lq): a logit per query row
        column = torch.broadcast_to(sinks.to(scores.dtype), (batch, heads, rows))[..., None]
    else:  # (H,) or (B, H): a logit per head
        column = torch.broadcast_to(sinks.to(scores.dtype), (batch, heads))[:, :, None, None]
    column = column.expand(*scores.shape[:-1], 1)
    weights, lse = _softmax(torch.cat([scores, column], -1),
                            torch.cat([allowed, torch.ones_like(allowed[..., :1])], -1))
    return weights[..., :-1], lse


def _normalize(normalize, scores, allowed, sinks=None):
    """Weights (masked keys exactly 0) and the lse (softmax only, else None)."""
    if sinks is not None:
        if normalize != "softmax":
            raise NotImplementedError("oracle: sinks join a softmax")
        return _sink_softmax(scores, allowed, sinks)
    if normalize == "softmax":
        return _softmax(scores, allowed)
    if normalize == "sigmoid":
        weights = torch.sigmoid(scores)
    elif normalize == "sparsemax":
        weights = _sparsemax(scores, allowed)
    elif normalize == "hard":
        weights = _hard(scores, allowed)
    elif callable(normalize):
        weights = normalize(scores, allowed)
    else:
        raise NotImplementedError(f"oracle: normalize {normalize!r}")
    return weights.masked_fill(~allowed, 0.0), None


def dense_attention(q, k, v, *, mask=None, bias=None, score="scaled_dot", scale=None, normalize="softmax",
                    dropout_p=0.0, return_weights=False, return_lse=False, backend=None, sinks=None,
                    dtype=torch.float64, out_dtype=None, differentiable=False):
    """``attnkit.attention``'s function, computed densely in ``dtype`` (float64 by default).

    Inputs of rank 2, 3 or 4; the result has the input's rank, in ``out_dtype``
    (default ``dtype``); with ``return_weights``/``return_lse`` an :class:`OracleOutput`.
    ``sinks`` (``(H,)``, or broadcastable to ``(B, H)`` or to ``(B, H, Lq)``) are one more column of every
    row's softmax, always allowed, whose weight is dropped (gpt-oss's attention sinks).
    ``backend`` is accepted and ignored, so a call's keyword arguments can be passed on as they are.
    ``differentiable``: keep the inputs' (and a tensor bias's) autograd history, so the oracle
    can be differentiated once or twice; otherwise it reads them detached.
    """
    grad = contextlib.nullcontext() if differentiable else torch.no_grad()
    own = (lambda t: t) if differentiable else (lambda t: t.detach())
    if dropout_p:
        raise NotImplementedError("oracle: dropout is random; compare with dropout_p=0")
    rank = q.dim()
    user_scores = (*q.shape[:-1], k.shape[-2])
    q, k, v = (_to_4d(own(t).to(dtype)) for t in (q, k, v))
    batch, heads, lq, d = q.shape
    lk, kv_heads = k.shape[2], k.shape[1]
    if kv_heads != heads:  # grouped queries: query head h reads key/value head h // (heads // kv_heads)
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)

    if mask is None:
        allowed = torch.ones(batch, heads, lq, lk, dtype=torch.bool, device=q.device)
    elif isinstance(mask, Mask):
        allowed = mask.materialize(lq, lk, batch=batch, heads=heads, device=q.device)
    else:
        allowed = _scores_picture(mask, user_scores)
    allowed = torch.broadcast_to(allowed, (batch, heads, lq, lk))

    # Keys masked for every query are padding: their K/V rows are zeroed, so nothing there reaches anything.
    dead = ~allowed.any(2, keepdim=True).transpose(2, 3)  # (B, H, Lk, 1)
    k, v = k.masked_fill(dead, 0.0), v.masked_fill(dead, 0.0)

    if scale is None:
        scale = 1.0 / math.sqrt(d) if score == "scaled_dot" and d > 0 else 1.0
    scores = _score(score, q, k) * scale
    if isinstance(bias, torch.Tensor):
        scores = scores + _scores_picture(own(bias).to(dtype), user_scores)
    elif bias is not None:
        dev = q.device
        idx = (torch.arange(batch, device=dev).view(-1, 1, 1, 1), torch.arange(heads, device=dev).view(1, -1, 1, 1),
               torch.arange(lq, device=dev).view(1, 1, -1, 1), torch.arange(lk, device=dev).view(1, 1, 1, -1))
        with grad:
            # A ScoreModifier is called with the lengths (ALiBi's alignment); any other callable without them.
            scores = bias.modify(scores, *idx, lq, lk) if isinstance(bias, ScoreModifier) else bias(scores, *idx)
        scores = torch.broadcast_to(scores, (batch, heads, lq, lk)).to(dtype)

    weights, lse = _normalize(normalize, scores, allowed, None if sinks is None else own(sinks).to(dtype))
    out = torch.einsum("bhij,bhjd->bhid", weights, v)
    out_dtype = dtype if out_dtype is None else out_dtype
    out = _from_4d(out, rank).to(out_dtype)
    if not (return_weights or return_lse):
        return out
    if return_lse and lse is None:
        raise ValueError("oracle: return_lse is defined for normalize='softmax' only")
    return OracleOutput(out, _from_4d(weights, rank).to(out_dtype) if return_weights else None,
                        _from_4d(lse, rank) if return_lse else None)
