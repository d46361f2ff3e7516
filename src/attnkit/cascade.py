"""``attnkit.cascade_attention``: requests that share a prefix read its keys once, merged with their suffixes.

Many requests over one system prompt (or one document) hold the same ``P`` prefix keys. Ordinary
attention reads them once per request. The cascade (Ye et al. 2024, "Cascade Inference: Memory
Bandwidth Efficient Shared Prefix Batch Decoding", FlashInfer; Juravsky et al. 2024, Hydragen,
arXiv:2402.05099) splits every request's softmax over its keys into two parts, exactly:

    prefix call:  the queries of all N requests stacked into one row block, against the prefix once
                  -> (o_p, lse_p)
    suffix calls: each request's queries against its own suffix keys (causal, bottom-right)
                  -> (o_s, lse_s)
    merge:        lse = logaddexp(lse_p, lse_s);  o = o_p exp(lse_p - lse) + o_s exp(lse_s - lse)

since a softmax over the union of two key sets is the two softmaxes weighted by their shares of the
denominator. Attention sinks (one logit ``s_h`` per head in every denominator) are joined once,
after the merge: ``o <- o exp(lse - logaddexp(lse, s_h))``; joining them in both parts would count
them twice.

Positions: request ``r`` holds ``P + S_r`` keys (prefix, then its suffix); its ``Lq`` queries are its
last ``Lq`` positions, ``P + S_r - Lq + i``. A causal ``window`` ``w`` (a query at ``p`` sees keys
``p - w .. p``, :func:`attnkit.masks.sliding_window` ``(w, 0)``) reaches back into the prefix for the
queries within ``w`` of it: the prefix call masks each stacked row to exactly the prefix keys its
window reaches and reads only the prefix keys some row reaches (none when no window reaches back).

The result equals ``attention(q_r, cat(prefix, suffix_r), mask=causal & window, sinks=...)`` per
request, to rounding (:mod:`tests.test_cascade`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .core import AttentionOutput, attention
from .errors import ArgumentError, DTypeError, ShapeError, check_int
from .masks import causal, sliding_window

__all__ = ["cascade_attention", "explain_cascade", "CascadePlan"]

_WHO = "attnkit.cascade_attention"


class CascadePlan(NamedTuple):
    """What :func:`cascade_attention` reads: the prefix keys ``[prefix_from, prefix_len)`` once for all
    ``stacked_rows`` query rows (no prefix call when ``prefix_from == prefix_len``), and each suffix once."""

    requests: int
    stacked_rows: int
    prefix_len: int
    prefix_from: int
    suffix_lengths: tuple[int, ...]
    prefix_reads_ordinary: int  # prefix keys the ordinary per-request calls read, in all: N P

    def __str__(self) -> str:
        read = self.prefix_len - self.prefix_from
        prefix = (f"prefix keys [{self.prefix_from}, {self.prefix_len}) read once for {self.stacked_rows} stacked "
                  f"query rows of {self.requests} requests (ordinary calls: {self.prefix_reads_ordinary} prefix key "
                  f"reads, cascade: {read})" if read else "no query's window reaches the prefix: no prefix call")
        return (f"cascade: {prefix}; {self.requests} suffix calls of {list(self.suffix_lengths)} keys; merged by "
                f"log-sum-exp, sinks joined once after the merge")


def _check(q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lengths, window, sinks):
    for name, t in (("q", q), ("prefix_k", prefix_k), ("prefix_v", prefix_v), ("suffix_k", suffix_k),
                    ("suffix_v", suffix_v)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise DTypeError(f"{_WHO}: {name} must be a floating tensor; got "
                             f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
    if q.dim() != 4:
        raise ShapeError(f"{_WHO}: q must have shape (requests, H, Lq, D); got {tuple(q.shape)}")
    n, _, lq, d = q.shape
    hkv = prefix_k.shape[-3] if prefix_k.dim() >= 3 else None
    if prefix_k.dim() not in (3, 4) or (prefix_k.dim() == 4 and prefix_k.shape[0] != 1) or prefix_k.shape[-1] != d:
        raise ShapeError(f"{_WHO}: prefix_k must have shape (H_kv, P, D={d}) or (1, H_kv, P, {d}); got "
                         f"{tuple(prefix_k.shape)}")
    p = prefix_k.shape[-2]
    if prefix_v.shape[:-1] != prefix_k.shape[:-1]:
        raise ShapeError(f"{_WHO}: prefix_v must have shape {tuple(prefix_k.shape[:-1])} + (Dv,); got "
                         f"{tuple(prefix_v.shape)}")
    if suffix_k.dim() != 4 or suffix_k.shape[0] != n or suffix_k.shape[1] != hkv or suffix_k.shape[-1] != d:
        raise ShapeError(f"{_WHO}: suffix_k must have shape (requests={n}, H_kv={hkv}, S, D={d}); got "
                         f"{tuple(suffix_k.shape)}")
    if suffix_v.shape[:-1] != suffix_k.shape[:-1] or suffix_v.shape[-1] != prefix_v.shape[-1]:
        raise ShapeError(f"{_WHO}: suffix_v must have shape {tuple(suffix_k.shape[:-1])} + (Dv={prefix_v.shape[-1]},)"
                         f"; got {tuple(suffix_v.shape)}")
    s = suffix_k.shape[2]
    if suffix_lengths is None:
        lengths = [s] * n
    else:
        if not isinstance(suffix_lengths, torch.Tensor) or suffix_lengths.shape != (n,) or \
                suffix_lengths.is_floating_point():
            raise ShapeError(f"{_WHO}: suffix_lengths must be an integer tensor of shape ({n},); got "
                             f"{getattr(suffix_lengths, 'shape', type(suffix_lengths).__name__)}")
        lengths = [int(x) for x in suffix_lengths]
    bad = [x for x in lengths if not lq <= x <= s]
    if bad:
        raise ArgumentError(f"{_WHO}: every suffix must hold the request's {lq} queries and fit the {s} suffix "
                            f"positions (Lq <= suffix_lengths[r] <= S); got suffix lengths {lengths}")
    if window is not None:
        check_int(_WHO, "window", window, 0)
    if sinks is not None and (not isinstance(sinks, torch.Tensor) or sinks.shape != (q.shape[1],)):
        raise ShapeError(f"{_WHO}: sinks must have shape (H={q.shape[1]},); got "
                         f"{getattr(sinks, 'shape', type(sinks).__name__)}")
    return n, lq, p, lengths


def _plan(n, lq, p, lengths, window) -> tuple[CascadePlan, torch.Tensor]:
    """The plan and each stacked row's first reachable prefix key ``(N * Lq,)`` (``p``: none)."""
    pos = torch.tensor([[p + length - lq + i for i in range(lq)] for length in lengths]).flatten()
    first = torch.zeros_like(pos) if window is None else (pos - window).clamp(0, p)
    start = int(first.min()) if len(first) else p
    return CascadePlan(n, n * lq, p, start, tuple(lengths), n * p), first


def explain_cascade(q, prefix_k, prefix_v, suffix_k, suffix_v, *, suffix_lengths=None, window=None,
                    sinks=None) -> CascadePlan:
    """What :func:`cascade_attention` with these arguments reads (``str()`` says it): the prefix once."""
    n, lq, p, lengths = _check(q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lengths, window, sinks)
    return _plan(n, lq, p, lengths, window)[0]


def cascade_attention(q: torch.Tensor, prefix_k: torch.Tensor, prefix_v: torch.Tensor, suffix_k: torch.Tensor,
                      suffix_v: torch.Tensor, *, suffix_lengths: torch.Tensor | None = None, window: int | None = None,
                      sinks: torch.Tensor | None = None, scale: float | None = None, return_lse: bool = False):
    """Causal softmax attention of ``N`` requests over one shared prefix and their own suffixes, the prefix read once.

    Shapes: ``q`` ``(N, H, Lq, D)`` (each request's last ``Lq`` positions), ``prefix_k`` ``(H_kv, P, D)`` or
    ``(1, H_kv, P, D)``, ``prefix_v`` likewise with ``Dv``; ``suffix_k`` ``(N, H_kv, S, D)``, ``suffix_v``
    ``(N, H_kv, S, Dv)``, request ``r`` holding its first ``suffix_lengths[r]`` positions (all ``S`` if None,
    at least ``Lq``) -> ``(N, H, Lq, Dv)`` (and the lse ``(N, H, Lq)`` with ``return_lse``).

    Equals, per request, ``attention(q[r], cat(prefix, suffix[r]), mask=causal() & sliding_window(window),
    sinks=sinks, scale=scale)``; see the module for the merge. :func:`explain_cascade` shows the plan.

    Complexity: the prefix's keys are read once for all ``N Lq`` queries instead of ``N`` times:
    ``O(N Lq (P + S) D)`` flops as the ordinary calls, ``O(P D)`` prefix bytes instead of ``O(N P D)``.

    Example:
        >>> import torch, attnkit
        >>> from attnkit import masks
        >>> _ = torch.manual_seed(0)
        >>> q, pk, pv = torch.randn(3, 2, 1, 8), torch.randn(2, 10, 8), torch.randn(2, 10, 8)
        >>> sk, sv = torch.randn(3, 2, 4, 8), torch.randn(3, 2, 4, 8)
        >>> out = attnkit.cascade_attention(q, pk, pv, sk, sv)
        >>> one = attnkit.attention(q[1:2], torch.cat([pk[None], sk[1:2]], 2), torch.cat([pv[None], sv[1:2]], 2),
        ...                         mask=masks.causal())
        >>> torch.allclose(out[1:2], one, atol=1e-6)
        True
    """
    n, lq, p, lengths = _check(q, prefix_k, prefix_v, suffix_k, suffix_v, suffix_lengths, window, sinks)
    plan, first = _plan(n, lq, p, lengths, window)
    pk, pv = (t if t.dim() == 4 else t[None] for t in (prefix_k, prefix_v))
    h, dv = q.shape[1], pv.shape[-1]
    mask = causal() if window is None else sliding_window(window, 0)
    out = q.new_empty(n, h, lq, dv)
    lse = q.new_empty(n, h, lq, dtype=torch.promote_types(q.dtype, torch.float32))
    for length in sorted(set(lengths)):  # one call per suffix length: causal (and windowed) bottom-right
        rows = [r for r in range(n) if lengths[r] == length]
        pick = slice(rows[0], rows[-1] + 1) if len(rows) == rows[-1] - rows[0] + 1 else torch.tensor(rows)
        got = attention(q[pick], suffix_k[pick, :, :length], suffix_v[pick, :, :length], mask=mask, scale=scale,
                        return_lse=True)
        assert isinstance(got, AttentionOutput) and got.lse is not None  # return_lse=True
        out[pick], lse[pick] = got.output, got.lse.to(lse.dtype)
    if plan.prefix_from < p:  # one call over the reached prefix keys for every request's queries, stacked
        keys = torch.arange(plan.prefix_from, p)
        allowed: torch.Tensor | None = None  # every row reaches every read key: no mask, torch's fused kernel
        if not bool((first == plan.prefix_from).all()):
            allowed = keys[None, :] >= first[:, None]  # (N Lq, P'): exactly the prefix keys each window reaches
        stacked = q.transpose(0, 1).reshape(1, h, n * lq, q.shape[-1])
        got = attention(stacked, pk[:, :, plan.prefix_from:], pv[:, :, plan.prefix_from:], mask=allowed,
                        scale=scale, return_lse=True)
        assert isinstance(got, AttentionOutput) and got.lse is not None  # return_lse=True
        o_p = got.output.reshape(h, n, lq, dv).transpose(0, 1)
        lse_p = got.lse.reshape(h, n, lq).transpose(0, 1)
        total = torch.logaddexp(lse, lse_p)
        out = (out * (lse - total).exp()[..., None].to(out.dtype)
               + o_p * (lse_p - total).exp()[..., None].to(out.dtype))  # the suffix part's lse is finite
        lse = total
    if sinks is not None:  # once, after the merge: the sink joins the one denominator of the whole row
        total = torch.logaddexp(lse, sinks.to(lse.dtype)[None, :, None])
        out = out * (lse - total).exp()[..., None].to(out.dtype)
        lse = total
    return (out, lse) if return_lse else out
