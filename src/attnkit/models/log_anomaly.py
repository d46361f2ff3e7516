"""LSTM event language model with attention over its history, for log anomaly detection (Brown et al. 2018)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from .. import masks
from ..errors import ArgumentError, check_int
from ..nn.derived_key import DerivedKeyAttention
from ._rnn import check_tokens, source_mask

__all__ = ["LogAnomalyDetector", "LogAnomalyOutput", "LogExplanation"]

_WHO = "LogAnomalyDetector"
_VARIANTS = ("fixed", "syntax", "semantic", "none")


class LogAnomalyOutput(NamedTuple):
    """logits ``(B, L, num_events)`` predicting each event; nll ``(B, L)`` (0 at padding); weights ``(B, L, L)``
    (None for ``attention="none"``): row t over the states ``h_0..h_t`` (column 0 = start, j = after event j-1)."""

    logits: torch.Tensor
    nll: torch.Tensor
    weights: torch.Tensor | None


class LogExplanation(NamedTuple):
    """event_scores ``(B, L)`` = nll; total ``(B,)`` and worst ``(B,)`` = their sum and max over real events;
    weights ``(B, L, L)`` as in :class:`LogAnomalyOutput`; looked_at ``(B, L)``: the earlier event each
    prediction weighted most (-1 = the start state; -1 everywhere without attention)."""

    event_scores: torch.Tensor
    total: torch.Tensor
    worst: torch.Tensor
    weights: torch.Tensor | None
    looked_at: torch.Tensor


class LogAnomalyDetector(nn.Module):
    """Event-sequence LSTM language model with attention over its past states; anomaly score = NLL.

    Brown, Tuor, Hutchinson & Nichols 2018, "Recurrent Neural Network Attention Mechanisms
    for Interpretable System Log Anomaly Detection", MLCS workshop, arXiv:1803.04967,
    Sec. 3 (event model and attention variants; eqs. 5-7 for the attention)::

        h_t = LSTM(x_{t-1}, h_{t-1}),  x_{-1} = start,   V_t = [h_0; ...; h_t]
        K = tanh(V_t W_a),   d_t = softmax(q_t K^T),   a_t = d_t V_t                 (5-7)
        fixed: q_t = q;   syntax: q_t = q_(t) (one learned query per position);   semantic: q_t = tanh(W_q h_t)
        p(x_t | x_<t) = softmax(W_p [h_t; a_t] + b_p),   score_t = -log p(x_t | x_<t)

    Notation: ``x_t`` = ``events[:, t]`` embedded by ``embed``; ``W_a`` and the fixed ``q``
    live in ``attention`` (:class:`~attnkit.nn.derived_key.DerivedKeyAttention`, with a
    causal mask); ``q_(t)`` = ``position_queries[t]``; ``W_q`` = ``query_proj``;
    ``W_p, b_p`` = ``out``; ``d_t`` = ``weights[:, t]``.

    Differences from the paper: events are given as ids (the paper's tokens of a log line
    or its fields); the "semantic 2" and tiered variants are not provided (see
    :class:`~attnkit.nn.segment.TieredAttention`); the attention includes the current state
    ``h_t``, so the first prediction attends to the start state; padding at the end by
    ``mask`` (True = a real event, left-aligned), which never changes the real positions.
    ``attention="none"`` is the plain LSTM event model (``W_p h_t``), the paper's baseline.

    Shapes:
        events ``(B, L)`` -> logits ``(B, L, num_events)``, nll ``(B, L)``, weights ``(B, L, L)``.

    Complexity: ``O(B L H^2)`` for the LSTM, ``O(B L^2 (H + attn_dim))`` for attention.

    Args:
        num_events: the event vocabulary size.
        embed_dim: event embedding size.
        hidden_dim: LSTM size ``H``.
        attention: "fixed", "syntax", "semantic" or "none".
        attn_dim: the attention size ``La``; default ``hidden_dim``.
        max_len: the longest sequence ("syntax" only: one query per position).

    Example:
        >>> import torch
        >>> from attnkit.models.log_anomaly import LogAnomalyDetector
        >>> _ = torch.manual_seed(0)
        >>> model = LogAnomalyDetector(9, embed_dim=4, hidden_dim=6)
        >>> events = torch.tensor([[1, 4, 4, 2, 7], [3, 3, 5, 0, 0]])
        >>> report = model.explain(events, mask=events > 0)
        >>> report.event_scores.shape, report.weights.shape, report.event_scores[1, 3:].tolist()
        (torch.Size([2, 5]), torch.Size([2, 5, 5]), [0.0, 0.0])
        >>> bool(torch.triu(report.weights, 1).eq(0).all())  # a prediction only looks at the past
        True
    """

    def __init__(self, num_events: int, *, embed_dim: int = 32, hidden_dim: int = 64, attention: str = "semantic",
                 attn_dim: int | None = None, max_len: int | None = None):
        super().__init__()
        check_int(_WHO, "num_events", num_events, 1)
        if attention not in _VARIANTS:
            raise ArgumentError(f"{_WHO}: attention must be one of {_VARIANTS}; got {attention!r}")
        attn_dim = hidden_dim if attn_dim is None else attn_dim
        self.num_events, self.variant = num_events, attention
        self.embed = nn.Embedding(num_events, embed_dim)
        self.start = nn.Parameter(torch.empty(embed_dim).uniform_(-1.0, 1.0))
        self.lstm = nn.LSTM(embed_dim, hidden_dim, batch_first=True)
        self.attention = None if attention == "none" else DerivedKeyAttention(
            hidden_dim, attn_dim, learned_query=attention == "fixed")
        if attention == "syntax":
            if max_len is None:
                raise ArgumentError(f"{_WHO}: attention='syntax' needs max_len (one query per position)")
            self.position_queries = nn.Parameter(torch.randn(check_int(_WHO, "max_len", max_len, 1), attn_dim)
                                                 * attn_dim ** -0.5)
        if attention == "semantic":
            self.query_proj = nn.Linear(hidden_dim, attn_dim, bias=False)
        self.out = nn.Linear(hidden_dim * (1 + (self.attention is not None)), num_events)

    def _queries(self, h):
        b, length = h.shape[:2]
        if self.variant == "fixed":
            return self.attention.query.to(h.dtype).expand(b, length, -1)
        if self.variant == "syntax":
            if length > self.position_queries.shape[0]:
                raise ArgumentError(f"{_WHO}: events are longer ({length}) than max_len="
                                    f"{self.position_queries.shape[0]} (attention='syntax')")
            return self.position_queries[:length].to(h.dtype).expand(b, -1, -1)
        return torch.tanh(self.query_proj(h))  # (B, L, La)

    def forward(self, events: torch.Tensor, *, mask: torch.Tensor | None = None) -> LogAnomalyOutput:
        """Predict every event from the ones before it; ``mask (B, L)``: True = a real event."""
        check_tokens(_WHO, "events", events, self.num_events, min_len=1)
        keep, _ = source_mask(_WHO, events.shape, events.device, None, mask)
        b = events.shape[0]
        x = torch.cat([self.start.expand(b, 1, -1), self.embed(events[:, :-1])], 1)  # (B, L, E): x_{t-1}
        h, _ = self.lstm(x[:, :events.shape[1]])  # (B, L, H): h_t has read the events before t
        weights = None
        if self.attention is not None:
            a, weights = self.attention(h, self._queries(h), mask=masks.causal())  # (B, L, H), (B, L, L)
            weights = weights.masked_fill(~keep[..., None], 0.0)
            h = torch.cat([h, a], -1)
        logits = self.out(h)  # (B, L, V)
        nll = F.cross_entropy(logits.transpose(1, 2), events.long(), reduction="none")  # (B, L); int32 ids too
        return LogAnomalyOutput(logits, nll.masked_fill(~keep, 0.0), weights)

    @torch.no_grad()
    def explain(self, events: torch.Tensor, *, mask: torch.Tensor | None = None) -> LogExplanation:
        """Per-event anomaly scores, their sum and max per sequence, and where each prediction looked."""
        out = self.forward(events, mask=mask)
        keep, _ = source_mask(_WHO, events.shape, events.device, None, mask)
        worst = out.nll.masked_fill(~keep, float("-inf")).amax(-1).masked_fill(~keep.any(-1), 0.0)
        looked = torch.full_like(events, -1) if out.weights is None else out.weights.argmax(-1) - 1
        return LogExplanation(out.nll, out.nll.sum(-1), worst, out.weights, looked.masked_fill(~keep, -1))
