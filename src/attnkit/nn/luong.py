"""Luong attention: global and local (monotonic / predictive) alignment with three scores."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from .. import recording
from ..costing.spec import Spec
from ..costing.tally import dtype_of
from ..errors import ArgumentError, ShapeError, check_int
from ..functional.normalize import softmax
from ..registry.entry import Entry, register
from ._inputs import check_memory, check_sequence
from .additive import (
    ADDITIVE_SIZES,
    AdditiveAttention,
    count_additive_score,
    dense_allowed,
    drop_unseen,
    query_key_inputs,
)

__all__ = ["LuongAttention", "LuongOutput"]

_SCORES = ("dot", "general", "concat")
_MODES = ("global", "local-m", "local-p")


class LuongOutput(NamedTuple):
    """hidden ``h~ (B, Lq, out_dim)``, context ``(B, Lq, Dk)``, weights ``(B, Lq, Lk)``, centers ``p_t (B|1, Lq)``."""

    hidden: torch.Tensor
    context: torch.Tensor
    weights: torch.Tensor
    centers: torch.Tensor | None


class LuongAttention(nn.Module):
    """Luong attention: a score, a global or local alignment, and ``h~_t = tanh(W_c [c_t; h_t])``.

    Luong, Pham & Manning 2015, "Effective Approaches to Attention-based Neural Machine
    Translation", EMNLP, arXiv:1508.04025, eqs. 5 and 7-10::

        score(h_t, h_s) = h_t^T h_s | h_t^T W_a h_s | v_a^T tanh(W_a [h_t; h_s])   (dot | general | concat)
        a_t(s) = softmax_s(score(h_t, h_s)) over all s (global) or s in [p_t - D, p_t + D] (local)
        local-m: p_t = t;   local-p: p_t = S sigmoid(v_p^T tanh(W_p h_t)),
                 a_t(s) <- a_t(s) exp(-(s - p_t)^2 / (2 sigma^2)),  sigma = D / 2
        c_t = sum_s a_t(s) h_s;   h~_t = tanh(W_c [c_t; h_t])

    Notation: ``h_t`` = ``query[:, i]`` (decoder state, ``t = step + i``), ``h_s`` =
    ``memory[:, s]`` (encoder states), ``W_a`` = ``w_a`` (general) or
    ``[concat.query_proj.weight | concat.key_proj.weight]`` with ``v_a`` = ``concat.v``,
    ``W_p`` = ``w_p.weight``, ``v_p`` = ``v_p``, ``W_c`` = ``w_c.weight``, ``D`` = ``window``,
    ``S`` = ``source_lengths`` (default ``Lk``).

    Differences from the paper: all decoder steps may be given at once; the window is
    every integer ``s`` with ``|s - p_t| <= D`` (``p_t`` is real, not rounded) and the
    weights are returned over all ``Lk`` positions (0 outside the window) instead of a
    ``2D+1`` slice; as in the paper, local-p weights are not renormalised after the
    Gaussian; masks. A query with no allowed key gets weights and context 0.

    Shapes:
        query ``(B, Lq, query_dim)``, memory ``(B, Lk, key_dim)`` -> hidden ``(B, Lq, out_dim)``,
        context ``(B, Lq, key_dim)``, weights ``(B, Lq, Lk)``.

    Complexity: ``O(B Lq Lk D)`` time and ``O(B Lq Lk)`` memory (the weights are returned);
    "concat" adds ``O(B Lq Lk hidden)`` time in bounded memory.

    Args:
        query_dim: features of ``h_t``.
        key_dim: features of ``h_s``; default ``query_dim`` ("dot" needs them equal).
        score: "dot", "general" or "concat".
        mode: "global", "local-m" or "local-p".
        window: ``D``, the half-width of the local window (local-p needs ``D >= 1``).
        hidden_dim: size of ``v_a`` (concat) and ``v_p`` (local-p); default ``query_dim``.
        out_dim: size of ``h~_t``; default ``query_dim``.

    Example:
        >>> import torch
        >>> from attnkit.nn.luong import LuongAttention
        >>> _ = torch.manual_seed(0)
        >>> attn = LuongAttention(4, 6, score="general", mode="local-p", window=2)
        >>> out = attn(torch.randn(2, 3, 4), torch.randn(2, 9, 6))
        >>> out.hidden.shape, out.context.shape, out.weights.shape, out.centers.shape
        (torch.Size([2, 3, 4]), torch.Size([2, 3, 6]), torch.Size([2, 3, 9]), torch.Size([2, 3]))
        >>> bool(((out.weights > 0).sum(-1) <= 5).all())  # at most 2D + 1 positions
        True
    """

    def __init__(self, query_dim: int, key_dim: int | None = None, *, score: str = "general",
                 mode: str = "global", window: int = 10, hidden_dim: int | None = None, out_dim: int | None = None):
        super().__init__()
        key_dim = query_dim if key_dim is None else key_dim
        hidden_dim = query_dim if hidden_dim is None else hidden_dim
        if score not in _SCORES:
            raise ArgumentError(f"LuongAttention: score must be one of {_SCORES}; got {score!r}")
        if mode not in _MODES:
            raise ArgumentError(f"LuongAttention: mode must be one of {_MODES}; got {mode!r}")
        if score == "dot" and key_dim != query_dim:
            raise ArgumentError(f"LuongAttention: score='dot' needs key_dim == query_dim; "
                                f"got key_dim={key_dim}, query_dim={query_dim}")
        check_int("LuongAttention", "window", window, 1 if mode == "local-p" else 0)
        self.query_dim, self.key_dim, self.score_name, self.mode, self.window = query_dim, key_dim, score, mode, window
        if score == "general":
            self.w_a = nn.Parameter(torch.empty(query_dim, key_dim).uniform_(-key_dim ** -0.5, key_dim ** -0.5))
        elif score == "concat":
            self.concat = AdditiveAttention(query_dim, key_dim, hidden_dim)
        if mode == "local-p":
            self.w_p = nn.Linear(query_dim, hidden_dim, bias=False)
            self.v_p = nn.Parameter(torch.empty(hidden_dim).uniform_(-hidden_dim ** -0.5, hidden_dim ** -0.5))
        self.w_c = nn.Linear(key_dim + query_dim, query_dim if out_dim is None else out_dim, bias=False)

    def score(self, query: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """Unmasked scores ``(B, Lq, Lk)`` (eq. 8)."""
        if self.score_name == "dot":
            return query @ memory.transpose(-1, -2)
        if self.score_name == "general":
            return (query @ self.w_a) @ memory.transpose(-1, -2)
        return self.concat.score(query, memory)

    def _centers(self, query, memory, step, source_lengths):
        """``p_t`` of shape ``(B|1, Lq)``: ``t`` for local-m (eq. before 9), eq. 9 for local-p."""
        lq, lk = query.shape[1], memory.shape[1]
        if self.mode == "local-m":
            return torch.arange(step, step + lq, device=query.device, dtype=query.dtype)[None]
        if source_lengths is None:
            length = torch.full((1, 1), float(lk), device=query.device, dtype=query.dtype)
        else:
            length = torch.as_tensor(source_lengths, device=query.device)
            if length.shape != (query.shape[0],):
                raise ShapeError(f"LuongAttention: source_lengths must have shape ({query.shape[0]},); "
                                 f"got {tuple(length.shape)}")
            length = length.to(query.dtype)[:, None]
        return length * torch.sigmoid(torch.tanh(self.w_p(query)) @ self.v_p)  # (B|1, Lq)

    def forward(self, query: torch.Tensor, memory: torch.Tensor, *, mask=None, step: int = 0,
                source_lengths: torch.Tensor | None = None) -> LuongOutput:
        """Attend. ``mask``: :mod:`attnkit.masks` mask or bool tensor, True = attend.

        ``step``: decoder time of ``query[:, 0]`` (local-m centres ``t = step + i``).
        ``source_lengths``: ``S`` per sample for local-p ``(B,)``; default ``Lk``.
        """
        check_sequence("LuongAttention", "query", query, self.query_dim, length="length", like=self)
        check_sequence("LuongAttention", "memory", memory, self.key_dim, length="length", like=self)
        check_memory("LuongAttention", query, memory, key_name="memory")
        check_int("LuongAttention", "step", step, 0)
        compute = torch.promote_types(query.dtype, torch.float32)  # softmax in float32 or better
        allowed = dense_allowed(mask, query, memory)  # (B|1, Lq|1, Lk)
        (memory,) = drop_unseen(allowed, memory)
        scores = self.score(query, memory).to(compute)  # (B, Lq, Lk)
        centers, gauss = None, None
        if self.mode != "global":
            centers = self._centers(query, memory, step, source_lengths)
            dist = torch.arange(memory.shape[1], device=query.device, dtype=compute) - centers[..., None].to(compute)
            inside = dist.abs() <= self.window  # (B|1, Lq, Lk)
            allowed = inside if allowed is None else allowed & inside
            if self.mode == "local-p":
                gauss = torch.exp(-dist.square() / (2 * (self.window / 2) ** 2))  # eq. 10
        weights = softmax(scores, allowed)[0]
        weights = (weights if gauss is None else weights * gauss).to(query.dtype)
        if recording.is_recording():  # computed without attnkit.attention: hand them to a recorder
            recording.report(weights, self)
        context = weights @ memory  # (B, Lq, Dk)
        hidden = torch.tanh(self.w_c(torch.cat([context, query], dim=-1)))  # eq. 5
        return LuongOutput(hidden, context, weights, centers)


def _example():
    g = torch.Generator().manual_seed(0)
    module = LuongAttention(8, 6, score="general", mode="local-p", window=2)
    return module, (torch.randn(2, 5, 8, generator=g), torch.randn(2, 7, 6, generator=g))


def _count(t, s, module=None):
    b, lq, lk, qd, kd = s["batch"], s["q_len"], s["kv_len"], s["query_dim"], s["key_dim"]
    a, out = s["hidden_dim"] or qd, s["out_dim"] or qd
    if s["score"] == "dot":
        t.mm("scores: h_t . h_s", b, lq, qd, lk)
    elif s["score"] == "general":
        t.mm("scores: h_t W_a", 1, b * lq, qd, kd)
        t.mm("scores: (h_t W_a) . h_s", b, lq, kd, lk)
    else:
        count_additive_score(t, {**s, "hidden_dim": a}, lq, lk, a)
    if s["mode"] == "local-p":
        t.mm("centres: W_p h_t", 1, b * lq, qd, a)
        t.ew("centres: v_p^T tanh(W_p h_t) (matrix-vector, not counted) and sigmoid", b * lq * a, 3)
    t.ew("softmax, window and Gaussian", b * lq * lk, 9)
    t.mm("context: weights @ h_s", b, lq, lk, kd)
    t.mm("W_c [c_t; h_t]", 1, b * lq, kd + qd, out)
    t.inter(b * lq * lk, b * lq * lk, b * lq * kd, b * lq * out)


def _config(m):
    hidden = m.v_p.shape[0] if m.mode == "local-p" else m.concat.v.shape[0] if m.score_name == "concat" else None
    return {"query_dim": m.query_dim, "key_dim": m.key_dim, "score": m.score_name, "mode": m.mode,
            "window": m.window, "out_dim": m.w_c.out_features, "hidden_dim": hidden or m.query_dim}


register(Entry("luong", LuongAttention, "Luong et al. 2015, arXiv:1508.04025, eqs. 5, 7-10",
               "O(Lq Lk D)", "dot/general/concat scores; global, local-m and local-p (Gaussian) alignment",
               family="module", example=_example,
               spec=Spec({**ADDITIVE_SIZES, "hidden_dim": None, "out_dim": None, "score": "general",
                          "mode": "local-p", "window": 2}, _count, query_key_inputs,
                         "scores (dot 2 B Lq Lk D | general + 2 B Lq Dq Dk | concat as additive); context "
                         "2 B Lq Lk Dk; W_c 2 B Lq (Dk + Dq) Dout; local-p centres 2 B Lq Dq A",
                         length=("q_len", "kv_len"), module_type=LuongAttention, config=_config,
                         make=lambda s: LuongAttention(s["query_dim"], s["key_dim"], score=s["score"],
                                                       mode=s["mode"], window=s["window"], hidden_dim=s["hidden_dim"],
                                                       out_dim=s["out_dim"]).to(dtype_of(s)))))
