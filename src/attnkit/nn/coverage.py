"""Coverage attention: additive attention that remembers where it has already looked."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from .. import recording
from ..costing.spec import Spec
from ..costing.tally import dtype_of
from ..errors import DTypeError
from ..functional.normalize import softmax
from ..registry.entry import Entry, register
from ._inputs import check_memory, check_sequence, check_shape
from .additive import (
    ADDITIVE_FORMULA,
    ADDITIVE_SIZES,
    DEFAULT_MAX_ELEMENTS,
    additive_scores,
    dense_allowed,
    drop_unseen,
    query_key_inputs,
    value_dim_of,
)

__all__ = ["CoverageAttention", "CoverageOutput", "coverage_loss"]


class CoverageOutput(NamedTuple):
    """context ``(B, Lq, Dv)``, weights ``(B, Lq, Lk)``, coverage after the last step ``(B, Lk)``,
    loss ``(B, Lq)``: the coverage loss of each step (eq. 12)."""

    context: torch.Tensor
    weights: torch.Tensor
    coverage: torch.Tensor
    loss: torch.Tensor


def coverage_loss(weights: torch.Tensor, coverage: torch.Tensor) -> torch.Tensor:
    """See et al. 2017, eq. 12: ``covloss_t = sum_i min(a_i^t, c_i^t)``; ``(..., Lk) -> (...)``."""
    return torch.minimum(weights, coverage).sum(-1)


class CoverageAttention(nn.Module):
    """Coverage attention: the running sum of past weights enters the additive score.

    See, Liu & Manning 2017, "Get To The Point: Summarization with Pointer-Generator
    Networks", ACL, arXiv:1704.04368, eqs. 10-13::

        c^t = sum_{t' < t} a^{t'}                                          (10)
        e_i^t = v^T tanh(W_h h_i + W_s s_t + w_c c_i^t + b_attn),   a^t = softmax(e^t)   (11)
        covloss_t = sum_i min(a_i^t, c_i^t)                                (12)
        loss_t = -log P(w*_t) + lambda covloss_t                           (13, the caller's sum)

    Notation: ``s_t`` = ``query[:, t]`` (decoder state), ``h_i`` = ``key[:, i]`` (encoder
    state), ``W_h`` = ``w_h.weight``, ``W_s`` = ``w_s.weight``, ``b_attn`` = ``w_s.bias``,
    ``w_c`` = ``w_c``, ``v`` = ``v``, ``c^t`` = ``coverage``; the context
    ``h*_t = sum_i a_i^t h_i`` uses ``value`` (default ``key``).

    Differences from the paper: several decoder steps may be given at once (they are
    processed in order, each seeing the coverage of the ones before); the coverage
    may start from a given vector (to continue a decode); masks. A step with no
    allowed key gets weights and context 0 and adds nothing to the coverage.

    Shapes:
        query ``(B, Lq, query_dim)``, key ``(B, Lk, key_dim)``, value ``(B, Lk, Dv)``,
        coverage ``(B, Lk)`` -> context ``(B, Lq, Dv)``, weights ``(B, Lq, Lk)``,
        coverage ``(B, Lk)``, loss ``(B, Lq)``.

    Complexity: ``O(B Lq Lk hidden)`` time, sequential over the ``Lq`` steps;
    ``O(B Lk hidden)`` extra memory per step.

    Args:
        query_dim: features of ``s_t``.
        key_dim: features of ``h_i``; default ``query_dim``.
        hidden_dim: size of ``v``; default ``query_dim``.
        max_elements: hidden-tensor elements built at once (see :func:`~attnkit.nn.additive.additive_scores`).

    Example:
        >>> import torch
        >>> from attnkit.nn.coverage import CoverageAttention
        >>> _ = torch.manual_seed(0)
        >>> attn = CoverageAttention(4, 6, 8)
        >>> key = torch.randn(2, 5, 6)
        >>> out = attn(torch.randn(2, 1, 4), key)  # first decoder step: coverage starts at 0
        >>> out = attn(torch.randn(2, 1, 4), key, coverage=out.coverage)  # next step
        >>> torch.allclose(out.coverage.sum(-1), torch.full((2,), 2.0)), out.loss.shape
        (True, torch.Size([2, 1]))
    """

    def __init__(self, query_dim: int, key_dim: int | None = None, hidden_dim: int | None = None, *,
                 max_elements: int = DEFAULT_MAX_ELEMENTS):
        super().__init__()
        key_dim = query_dim if key_dim is None else key_dim
        hidden_dim = query_dim if hidden_dim is None else hidden_dim
        self.query_dim, self.key_dim, self.max_elements = query_dim, key_dim, max_elements
        self.w_h = nn.Linear(key_dim, hidden_dim, bias=False)
        self.w_s = nn.Linear(query_dim, hidden_dim, bias=True)
        bound = hidden_dim ** -0.5
        self.w_c = nn.Parameter(torch.empty(hidden_dim).uniform_(-bound, bound))
        self.v = nn.Parameter(torch.empty(hidden_dim).uniform_(-bound, bound))

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor | None = None,
                coverage: torch.Tensor | None = None, *, mask=None) -> CoverageOutput:
        """Run ``Lq`` decoder steps from ``coverage`` (default zeros); ``mask``: True = attend."""
        value = key if value is None else value
        check_sequence("CoverageAttention", "query", query, self.query_dim, length="length", like=self)
        check_sequence("CoverageAttention", "key", key, self.key_dim, length="length", like=self)
        check_memory("CoverageAttention", query, key, value)
        batch, lk = key.shape[:2]
        if coverage is None:
            coverage = key.new_zeros(batch, lk)
        elif not isinstance(coverage, torch.Tensor):
            raise DTypeError(f"CoverageAttention: coverage must be a tensor (batch, key_len); "
                             f"got {type(coverage).__name__}")
        else:
            check_shape("CoverageAttention", "coverage", coverage, lambda t: t.shape == (batch, lk),
                        f"have shape (batch, key_len) = ({batch}, {lk})")
        allowed = dense_allowed(mask, query, key)  # (B|1, Lq|1, Lk)
        key, value = drop_unseen(allowed, key, value)
        compute = torch.promote_types(query.dtype, torch.float32)
        pk, pq = self.w_h(key), self.w_s(query)  # (B, Lk, A), (B, Lq, A)
        contexts, all_weights, losses = [], [], []
        for t in range(query.shape[1]):
            keys_t = pk + coverage[..., None] * self.w_c  # (B, Lk, A): W_h h_i + w_c c_i^t
            scores = additive_scores(pq[:, t:t + 1], keys_t, self.v, max_elements=self.max_elements)  # (B, 1, Lk)
            row = None if allowed is None else allowed[:, min(t, allowed.shape[1] - 1)][:, None]
            weights = softmax(scores.to(compute), row)[0].to(query.dtype)  # (B, 1, Lk)
            losses.append(coverage_loss(weights[:, 0], coverage))
            contexts.append(weights @ value)
            all_weights.append(weights)
            coverage = coverage + weights[:, 0]
        if not contexts:
            return CoverageOutput(value.new_zeros(batch, 0, value.shape[-1]), key.new_zeros(batch, 0, lk),
                                  coverage, key.new_zeros(batch, 0))
        weights = torch.cat(all_weights, 1)  # (B, Lq, Lk)
        if recording.is_recording():  # computed without attnkit.attention: hand them to a recorder
            recording.report(weights, self)
        return CoverageOutput(torch.cat(contexts, 1), weights, coverage, torch.stack(losses, 1))


def _example():
    g = torch.Generator().manual_seed(0)
    return CoverageAttention(8, 6, 16), (torch.randn(2, 5, 8, generator=g), torch.randn(2, 7, 6, generator=g))


def _count(t, s, module=None):
    b, lq, lk, a, dv = s["batch"], s["q_len"], s["kv_len"], s["hidden_dim"], value_dim_of(s)
    t.mm("W_h h", 1, b * lk, s["key_dim"], a)
    t.mm("W_s s", 1, b * lq, s["query_dim"], a)
    t.ew("scores: v^T tanh(W_h h + W_s s + w_c c) (matrix-vector, not counted)", b * lq * lk * a, 6)
    t.ew("softmax, coverage update and loss", b * lq * lk, 8)
    t.mm("weights @ v (one step at a time)", b * lq, 1, lk, dv)
    t.inter(b * lk * a, b * lq * a, b * lq * lk, b * lq * dv)
    t.io(b * lq * s["query_dim"], b * lk * s["key_dim"])


register(Entry("coverage-attention", CoverageAttention, "See et al. 2017, arXiv:1704.04368, eqs. 10-13",
               "O(Lq Lk A)", "additive attention fed the running sum of past weights, with the coverage loss",
               family="module", example=_example,
               spec=Spec({**ADDITIVE_SIZES, "value_dim": None}, _count,
                         lambda s, m: query_key_inputs(s, m, s["value_dim"]),
                         ADDITIVE_FORMULA + " (the score one step at a time)", length=("q_len", "kv_len"),
                         make=lambda s: CoverageAttention(s["query_dim"], s["key_dim"],
                                                          s["hidden_dim"]).to(dtype_of(s)),
                         module_type=CoverageAttention,
                         config=lambda m: {"query_dim": m.query_dim, "key_dim": m.key_dim,
                                           "hidden_dim": m.v.shape[0]})))
