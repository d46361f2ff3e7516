"""Attention over whole segments (phrases) and coarse-to-fine tiered attention over groups of tokens."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from .. import recording
from ..core import attention
from ..costing.attend import attend
from ..costing.spec import Spec
from ..costing.tally import dtype_of, ones, randn, zeros
from ..errors import ArgumentError, DTypeError
from ..functional.normalize import softmax
from ..registry.entry import Entry, register
from ._inputs import check_keep_mask, check_sequence, check_shape
from .pooling import POOL_SCORES, AttentionPooling, count_mean

__all__ = ["SegmentAttention", "TieredAttention", "SegmentOutput"]


class SegmentOutput(NamedTuple):
    """output ``(B, Lq, dim)``; segment_weights ``(B, Lq, S)``; token_weights ``(B, Lq, n)``."""

    output: torch.Tensor
    segment_weights: torch.Tensor
    token_weights: torch.Tensor


def _check_inputs(who, query, x, query_dim, dim, keep, module):
    check_sequence(who, "x", x, dim, length="length", like=module)
    check_sequence(who, "query", query, query_dim, batch=x.shape[0], length="length", like=module)
    check_keep_mask(who, "mask", keep, *x.shape[:2], true_means="a real token", dims="")


def _membership(who, ids, x, keep, num):
    """``(B|1, S, n)`` bool: token j is in segment s (and kept); ``num`` defaults to ``max(ids) + 1``."""
    if not isinstance(ids, torch.Tensor) or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        got = ids.dtype if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise DTypeError(f"{who}: segment ids must be an integer tensor; got {got}")
    b, n = x.shape[:2]
    ids = ids[None] if ids.dim() == 1 else ids
    check_shape(who, "segment ids", ids, lambda t: t.dim() == 2 and t.shape[0] in (1, b) and t.shape[1] == n,
                f"have shape ({n},) or ({b}, {n})")
    num = (int(ids.max()) + 1 if ids.numel() else 0) if num is None else num
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num):
        raise ArgumentError(f"{who}: segment ids must lie in [0, {num}); got values in "
                            f"[{int(ids.min())}, {int(ids.max())}]")
    member = ids[:, None, :] == torch.arange(num, device=ids.device)[:, None]  # (B|1, S, n)
    return member if keep is None else member & keep[:, None, :]


def _pool(x, member, pooler=None):
    """Segment representations ``(B, S, D)`` and within-segment weights ``(B, S, n)``: mean or attention pooling."""
    b, s = x.shape[0], member.shape[1]
    if pooler is None:  # equal scores: the mean of the segment's tokens
        q, k = x.new_zeros(b, s, 1), x.new_zeros(b, x.shape[1], 1)
    else:
        q, k = pooler.context.to(x.dtype).expand(b, s, -1), torch.tanh(pooler.proj(x))
    out = attention(q, k, x, mask=member, score="dot", scale=1.0, return_weights=True)
    return out.output, out.weights


class _Projections(nn.Module):
    def __init__(self, dim, query_dim):
        super().__init__()
        self.dim, self.query_dim = dim, dim if query_dim is None else query_dim
        self.q_proj = nn.Linear(self.query_dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)


class SegmentAttention(_Projections):
    """Attention to whole segments: tokens are pooled per segment, then queries attend over segments.

    Segment-level attention (the seeds' "attend to whole segments or phrases"); the
    pooling is the mean or the context-vector attention of Yang et al. 2016 (NAACL,
    eqs. 5-7), and the segment attention is scaled dot-product (Vaswani et al. 2017,
    arXiv:1706.03762, eq. 1)::

        g_s = sum_{t in s} beta_t x_t,   alpha = softmax(W_q q (W_k g)^T / sqrt(dim)),   out = sum_s alpha_s W_v g_s
        token weight of t = alpha_{s(t)} beta_t   (so out = sum_t alpha_{s(t)} beta_t W_v x_t)

    Notation: ``g`` = pooled segments, ``beta`` = within-segment weights (``1/|s|``
    for the mean), ``alpha`` = ``segment_weights``; ``W_q, W_k, W_v`` = ``q_proj,
    k_proj, v_proj``; the token weights ``alpha_{s(t)} beta_t`` = ``token_weights``.

    Differences from the paper: no single paper defines it; with one token per
    segment it is exactly scaled dot-product attention over the tokens.

    Shapes:
        query ``(B, Lq, query_dim)``, x ``(B, n, dim)``, segment_ids ``(n,)`` or ``(B, n)``
        with values in ``[0, S)``, mask ``(B, n)`` (True = a real token) -> output
        ``(B, Lq, dim)``, segment_weights ``(B, Lq, S)``, token_weights ``(B, Lq, n)``.
        Empty segments get weight 0; a query with no segment gets output 0.

    Complexity: ``O(B S n dim)`` for pooling, ``O(B Lq S dim)`` for attention.

    Args:
        dim: features of a token.
        query_dim: features of a query; default ``dim``.
        pool: ``"mean"`` or ``"attention"`` (a learned context vector, as in Yang et al.).

    Example:
        >>> import torch
        >>> from attnkit.nn.segment import SegmentAttention
        >>> _ = torch.manual_seed(0)
        >>> attn = SegmentAttention(6)
        >>> x = torch.randn(2, 7, 6)
        >>> out, seg_w, tok_w = attn(x, x, torch.tensor([0, 0, 1, 1, 1, 2, 2]))
        >>> out.shape, seg_w.shape, tok_w.shape
        (torch.Size([2, 7, 6]), torch.Size([2, 7, 3]), torch.Size([2, 7, 7]))
        >>> torch.equal(tok_w[0, 0, 0], tok_w[0, 0, 1])  # mean pooling: equal shares inside a segment
        True
    """

    def __init__(self, dim: int, *, query_dim: int | None = None, pool: str = "mean"):
        super().__init__(dim, query_dim)
        if pool not in ("mean", "attention"):
            raise ArgumentError(f"SegmentAttention: pool must be 'mean' or 'attention'; got {pool!r}")
        self.pooler = AttentionPooling(dim) if pool == "attention" else None

    def forward(self, query: torch.Tensor, x: torch.Tensor, segment_ids: torch.Tensor, *,
                mask: torch.Tensor | None = None, num_segments: int | None = None) -> SegmentOutput:
        """Attend from ``query`` over the segments of ``x``."""
        _check_inputs("SegmentAttention", query, x, self.query_dim, self.dim, mask, self)
        member = _membership("SegmentAttention", segment_ids, x, mask, num_segments)  # (B|1, S, n)
        pooled, beta = _pool(x, member, self.pooler)  # (B, S, dim), (B, S, n)
        present = member.any(-1)[:, None, :]  # (B|1, 1, S): empty segments are masked
        out = attention(self.q_proj(query), self.k_proj(pooled), self.v_proj(pooled), mask=present,
                        return_weights=True)
        return SegmentOutput(out.output, out.weights, out.weights @ beta)


def _group_lse(scores, ids, num):
    """Per (row, group) log-sum-exp of ``scores (B, Lq, n)`` over each group's finite entries: ``(B, Lq, G)``.

    Groups with no finite entry get 0 (callers never read them).
    """
    idx = ids[:, None, :].expand(scores.shape)
    top = scores.new_full(scores.shape[:-1] + (num,), float("-inf")).scatter_reduce(-1, idx, scores.detach(), "amax")
    top = torch.where(torch.isneginf(top), torch.zeros_like(top), top)  # shift invariance: any finite shift works
    total = torch.zeros_like(top).scatter_add(-1, idx, torch.exp(scores - top.gather(-1, idx)))
    return top + torch.log(torch.where(total > 0, total, torch.ones_like(total)))


class TieredAttention(_Projections):
    """Coarse-to-fine attention: attend over groups first, then over the tokens within the groups.

    Tiered attention (the seeds' "first broader categories, then specific details";
    cf. the tiered model of Brown et al. 2018, arXiv:1803.04967), with scaled dot
    scores (Vaswani et al. 2017, arXiv:1706.03762, eq. 1) at both levels::

        alpha_g = softmax_g(W_q q . mean_{t in g} W_k x_t / sqrt(dim))      (groups; top-k form: the k best only)
        beta_t  = softmax_{t in g(t)}(W_q q . W_k x_t / sqrt(dim))          (tokens, within their group)
        weight_t = alpha_{g(t)} beta_t,   out = sum_t weight_t W_v x_t

    Notation: ``alpha`` = ``segment_weights`` (per group), ``weight`` = ``token_weights``.

    Differences from the paper: a general module rather than Brown et al.'s two stacked
    RNN tiers. The top-k form (``top_k=k``) renormalises ``alpha`` over the k best
    groups and gives every other token weight exactly 0; it masks rather than gathers,
    so its cost is the soft form's. With one group (or ``top_k >= G``) it is the soft
    form; with one group it is plain scaled dot-product attention.

    Shapes:
        as :class:`SegmentAttention`, with ``group_ids`` for segment ids.

    Complexity: ``O(B Lq (G + n) dim)`` time; ``O(B Lq (G + n))`` memory.

    Args:
        dim: features of a token.
        query_dim: features of a query; default ``dim``.
        top_k: attend only inside the ``top_k`` best groups (None: soft form).

    Example:
        >>> import torch
        >>> from attnkit.nn.segment import TieredAttention
        >>> _ = torch.manual_seed(0)
        >>> attn = TieredAttention(6, top_k=1)
        >>> x = torch.randn(2, 7, 6)
        >>> out, group_w, tok_w = attn(x[:, :2], x, torch.tensor([0, 0, 1, 1, 1, 2, 2]))
        >>> (group_w > 0).sum(-1).tolist(), round(tok_w.sum(-1)[0, 0].item(), 6)
        ([[1, 1], [1, 1]], 1.0)
    """

    def __init__(self, dim: int, *, query_dim: int | None = None, top_k: int | None = None):
        super().__init__(dim, query_dim)
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ArgumentError(f"TieredAttention: top_k must be None or an int >= 1; got {top_k!r}")
        self.top_k = top_k

    def _group_weights(self, q, keys, member):
        """alpha ``(B, Lq, G)``, log alpha (0 outside the attended groups) and which groups are attended."""
        with recording.suspended():  # a mean of keys, not an attention map to record
            group_keys, _ = _pool(keys, member)  # (B, G, dim): the mean key of each group
        scores = q @ group_keys.transpose(1, 2) / math.sqrt(self.dim)  # (B, Lq, G)
        allowed = member.any(-1)[:, None, :].expand(scores.shape)
        if self.top_k is not None and self.top_k < scores.shape[-1]:
            best = scores.masked_fill(~allowed, float("-inf")).topk(self.top_k, dim=-1).indices
            allowed = allowed & torch.zeros_like(allowed).scatter_(-1, best, True)
        alpha, lse = softmax(scores, allowed)
        if recording.is_recording():  # alpha is computed without attnkit.attention: hand it to a recorder
            recording.report(alpha, self)
        return alpha, torch.where(allowed, scores - lse[..., None], torch.zeros_like(scores)), allowed

    def forward(self, query: torch.Tensor, x: torch.Tensor, group_ids: torch.Tensor, *,
                mask: torch.Tensor | None = None, num_groups: int | None = None) -> SegmentOutput:
        """Attend from ``query`` over the groups of ``x``, then inside them."""
        _check_inputs("TieredAttention", query, x, self.query_dim, self.dim, mask, self)
        member = _membership("TieredAttention", group_ids, x, mask, num_groups)  # (B|1, G, n)
        q, keys, values = self.q_proj(query), self.k_proj(x), self.v_proj(x)
        alpha, log_alpha, groups_on = self._group_weights(q, keys, member)
        ids = group_ids.long().reshape(-1, x.shape[1]).expand(x.shape[0], -1)  # (B, n)
        idx = ids[:, None, :].expand(q.shape[0], q.shape[1], x.shape[1])  # (B, Lq, n)
        tokens_on = groups_on.gather(-1, idx)
        if mask is not None:
            tokens_on = tokens_on & mask[:, None, :]
        scores = (q @ keys.transpose(1, 2) / math.sqrt(self.dim)).masked_fill(~tokens_on, float("-inf"))
        within = _group_lse(scores, ids, alpha.shape[-1])  # (B, Lq, G)
        # softmax over all tokens of s_t + log alpha_g - lse_g has normaliser 1, so it is alpha_g * beta_t exactly.
        logits = (scores + log_alpha.gather(-1, idx) - within.gather(-1, idx)).masked_fill(~tokens_on, 0.0)
        out = attention(q.new_zeros(q.shape[0], q.shape[1], 1), keys.new_zeros(x.shape[0], x.shape[1], 1), values,
                        bias=logits, mask=tokens_on, score="dot", return_weights=True)
        return SegmentOutput(out.output, alpha, out.weights)


def _example(cls, **kwargs):
    def build():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2, 9, 8, generator=g)
        return cls(8, **kwargs), (torch.randn(2, 4, 8, generator=g), x, torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2]))
    return build


def _segment_count(t, s, module=None):
    b, lq, n, d, groups, dt = s["batch"], s["q_len"], s["length"], s["dim"], s["segments"], dtype_of(s)
    attentive = s["pool"] == "attention"
    if attentive:
        t.mm("pooling: tanh(W x + b)", 1, b * n, d, d)
        attend(t, "pooling: ", b, 1, groups, n, d, d, dtype=dt, mask=ones(1, 1, groups, n), **POOL_SCORES)
    else:
        count_mean(t, "pooling (mean): ", b, groups, n, d, dt)
    t.mm("projections: W_q q", 1, b * lq, s["query_dim"] or d, d)
    t.mm("projections: W_k g, W_v g", 2, b * groups, d, d)
    attend(t, "segments: ", b, 1, lq, groups, d, d, dtype=dt, mask=ones(1, 1, 1, groups), return_weights=True)
    t.mm("token weights: alpha @ beta", b, lq, groups, n, grads=1 + attentive)


def _tiered_count(t, s, module=None):
    b, lq, n, d, groups, dt = s["batch"], s["q_len"], s["length"], s["dim"], s["groups"], dtype_of(s)
    t.mm("projections: W_q q", 1, b * lq, s["query_dim"] or d, d)
    t.mm("projections: W_k x, W_v x", 2, b * n, d, d)
    count_mean(t, "group keys (mean): ", b, groups, n, d, dt)
    t.mm("group scores: q . mean key", b, lq, d, groups)
    t.mm("token scores: q . k", b, lq, d, n)
    t.ew("group softmax, top-k and within-group log-sum-exp", b * lq * (n + groups), 12)
    t.inter(b * lq * groups, b * lq * n)
    attend(t, "tokens: ", b, 1, lq, n, 1, d, dtype=dt, grads=(False, False, True), weights_grad=True,
           bias=zeros(dt, b, 1, lq, n), mask=ones(b, 1, lq, n), **POOL_SCORES)


def _inputs(s, module):
    n, groups = s["length"], s["segments" if "segments" in s else "groups"]
    ids = torch.arange(n) * groups // max(n, 1)
    return module, (randn(s["batch"], s["q_len"], s["query_dim"] or s["dim"], dtype=dtype_of(s)),
                    randn(s["batch"], n, s["dim"], seed=1, dtype=dtype_of(s)), ids)


_SIZES = {"batch": 2, "q_len": 4, "length": 9, "dim": 8, "query_dim": None, "dtype": "float32"}
register(Entry("segment-attention", SegmentAttention, "Yang et al. 2016, NAACL (pooling); Vaswani et al. 2017, "
               "arXiv:1706.03762, eq. 1 (scores)", "O(S n D + Lq S D)",
               "pool tokens per segment, attend over segments; token weights = segment weight x share",
               family="module", example=_example(SegmentAttention),
               spec=Spec({**_SIZES, "segments": 3, "pool": "mean"}, _segment_count, _inputs,
                         "pooling 2 B S n (1 + D); projections 2 B (Lq Dq + 2 S D) D; attention 2 B Lq S 2D; "
                         "tokens 2 B Lq S n",
                         make=lambda s: SegmentAttention(s["dim"], query_dim=s["query_dim"],
                                                         pool=s["pool"]).to(dtype_of(s)),
                         module_type=SegmentAttention,
                         config=lambda m: {"dim": m.dim, "query_dim": m.query_dim,
                                           "pool": "mean" if m.pooler is None else "attention"})))
register(Entry("tiered-attention", TieredAttention, "Brown et al. 2018, arXiv:1803.04967 (tiers); Vaswani et al. "
               "2017, arXiv:1706.03762, eq. 1 (scores)", "O(Lq (G + n) D)",
               "attend over groups, then within them: weight = group weight x within-group weight; top-k form",
               family="module", example=_example(TieredAttention, top_k=2),
               spec=Spec({**_SIZES, "groups": 3, "top_k": 2}, _tiered_count, _inputs,
                         "projections 2 B (Lq Dq + 2 n D) D; group keys 2 B G n (1 + D); scores 2 B Lq (G + n) D; "
                         "weights @ v 2 B Lq n (1 + D)",
                         make=lambda s: TieredAttention(s["dim"], query_dim=s["query_dim"],
                                                        top_k=s["top_k"]).to(dtype_of(s)),
                         module_type=TieredAttention, nullable=frozenset({"top_k"}),
                         config=lambda m: {"dim": m.dim, "query_dim": m.query_dim, "top_k": m.top_k})))
