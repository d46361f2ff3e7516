"""Hard attention (Xu et al. 2015): sample, argmax or Gumbel-relax one location; soft as the baseline."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from .. import recording
from ..costing.spec import Spec
from ..costing.tally import dtype_of
from ..errors import ArgumentError
from ..functional.normalize import gumbel_softmax, hard, softmax
from ..registry.entry import Entry, register
from ._inputs import check_memory, check_sequence
from .additive import (
    ADDITIVE_FORMULA,
    ADDITIVE_SIZES,
    DEFAULT_MAX_ELEMENTS,
    AdditiveAttention,
    count_additive_score,
    dense_allowed,
    drop_unseen,
    query_key_inputs,
    value_dim_of,
)

__all__ = ["HardAttention", "HardOutput"]

_MODES = ("soft", "stochastic", "argmax", "gumbel")


class HardOutput(NamedTuple):
    """context ``(B, Lq, Dv)``; weights ``(B, Lq, Lk)`` actually used (one-hot unless soft/relaxed);
    probs ``alpha (B, Lq, Lk)``; log_prob ``log alpha_{s} (B, Lq)`` of the sample (stochastic mode only)."""

    context: torch.Tensor
    weights: torch.Tensor
    probs: torch.Tensor
    log_prob: torch.Tensor | None


class HardAttention(nn.Module):
    """Hard attention: attend to one location ``s ~ Multinoulli(alpha)`` instead of the average.

    Xu et al. 2015, "Show, Attend and Tell", ICML, arXiv:1502.03044, Sec. 4.1 (stochastic
    "hard" attention) and Sec. 4.2 (deterministic "soft" attention)::

        e_ti = f_att(a_i, h_{t-1}),   alpha_t = softmax(e_t)
        stochastic: s_t ~ Multinoulli(alpha_t),  z_t = a_{s_t}   (REINFORCE: grad = R * d log alpha_{t, s_t})
        soft:       z_t = sum_i alpha_ti a_i

    Notation: ``h_{t-1}`` = ``query[:, t]``, ``a_i`` = ``key[:, i]`` (and ``value[:, i]``),
    ``f_att`` = ``f_att`` (:class:`~attnkit.nn.additive.AdditiveAttention`'s score), ``z_t`` = ``context``.

    Modes: "soft" (default; the deterministic soft attention it is compared with),
    "stochastic" (one sampled location per query from ``generator``; ``log_prob`` is
    ``log alpha_{s_t}``, so ``-(reward * log_prob).sum()`` is the REINFORCE loss; no
    gradient reaches ``f_att`` through ``context``), "argmax" (deterministic: the most
    likely location; ties to the lowest index; gradient to ``f_att`` is 0, or the
    softmax's with ``straight_through=True``), "gumbel" (Jang et al. 2017,
    arXiv:1611.01144: ``softmax((e + g) / tau)``, ``g ~ Gumbel(0, 1)``; with
    ``straight_through=True`` a one-hot forward and the relaxed backward).

    Differences from the paper: ``f_att`` is the one-hidden-layer additive MLP; the
    moving-average baseline and entropy term of eq. 12 are left to the caller (``probs``
    is returned for the entropy); masks. A query with no allowed key gets weights,
    context and ``log_prob`` 0.

    Shapes:
        query ``(B, Lq, query_dim)``, key ``(B, Lk, key_dim)``, value ``(B, Lk, Dv)`` (default key)
        -> context ``(B, Lq, Dv)``, weights and probs ``(B, Lq, Lk)``, log_prob ``(B, Lq)``.

    Complexity: ``O(B Lq Lk hidden)`` for the scores, ``O(B Lq Lk)`` for sampling.

    Args:
        query_dim: features of ``h_{t-1}``.
        key_dim: features of ``a_i``; default ``query_dim``.
        hidden_dim: hidden size of ``f_att``; default ``query_dim``.
        mode: "soft", "stochastic", "argmax" or "gumbel".
        tau: Gumbel-softmax temperature (> 0).
        straight_through: one-hot forward with the soft backward ("argmax", "gumbel").
        max_elements: hidden-tensor elements built at once for the scores.

    Example:
        >>> import torch
        >>> from attnkit.nn.hard import HardAttention
        >>> _ = torch.manual_seed(0)
        >>> attn = HardAttention(4, 6, 8, mode="stochastic")
        >>> out = attn(torch.randn(2, 3, 4), torch.randn(2, 5, 6), generator=torch.Generator().manual_seed(1))
        >>> out.weights.sum(-1).tolist(), out.log_prob.shape
        ([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], torch.Size([2, 3]))
    """

    def __init__(self, query_dim: int, key_dim: int | None = None, hidden_dim: int | None = None, *,
                 mode: str = "soft", tau: float = 1.0, straight_through: bool = False,
                 max_elements: int = DEFAULT_MAX_ELEMENTS):
        super().__init__()
        if mode not in _MODES:
            raise ArgumentError(f"HardAttention: mode must be one of {_MODES}; got {mode!r}")
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not (math.isfinite(tau) and tau > 0):
            raise ArgumentError(f"HardAttention: tau must be a finite number > 0; got {tau!r}")
        self.mode, self.tau, self.straight_through = mode, float(tau), bool(straight_through)
        self.f_att = AdditiveAttention(query_dim, key_dim, hidden_dim, max_elements=max_elements)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor | None = None, *,
                mask=None, generator: torch.Generator | None = None) -> HardOutput:
        """Attend. ``mask``: :mod:`attnkit.masks` mask or bool tensor, True = attend.

        ``generator`` drives the sampling ("stochastic", "gumbel"); None uses torch's global RNG.
        """
        value = key if value is None else value
        check_sequence("HardAttention", "query", query, self.f_att.query_dim, length="length", like=self)
        check_sequence("HardAttention", "key", key, self.f_att.key_dim, length="length", like=self)
        check_memory("HardAttention", query, key, value)
        compute = torch.promote_types(query.dtype, torch.float32)
        allowed = dense_allowed(mask, query, key)  # (B|1, Lq|1, Lk)
        key, value = drop_unseen(allowed, key, value)
        scores = self.f_att.score(query, key).to(compute)  # (B, Lq, Lk)
        probs, lse = softmax(scores, allowed)
        log_prob = None
        if self.mode == "soft":
            weights = probs
        elif self.mode == "stochastic":
            weights, log_prob = self._sample(scores, probs, lse, generator)
        elif self.mode == "argmax":
            weights = hard(scores, allowed)
            weights = weights if self.straight_through else weights.detach()
        else:
            weights = gumbel_softmax(scores, allowed, tau=self.tau, hard_sample=self.straight_through,
                                     generator=generator)
        if allowed is not None:
            weights = weights.masked_fill(~allowed, 0.0)
        weights = weights.to(query.dtype)
        if recording.is_recording():  # computed without attnkit.attention: hand them to a recorder
            recording.report(weights, self)
        return HardOutput(weights @ value, weights, probs.to(query.dtype), log_prob)

    @staticmethod
    def _sample(scores, probs, lse, generator):
        """One-hot samples from ``probs`` (no gradient) and their log-probability (with gradient)."""
        has_key = probs.sum(-1, keepdim=True) > 0  # (B, Lq, 1)
        if probs.shape[-1] == 0:
            return probs.detach(), scores.new_zeros(scores.shape[:-1])
        draw = torch.where(has_key, probs.detach(), torch.ones_like(probs))  # a row with no key draws anything
        idx = torch.multinomial(draw.reshape(-1, draw.shape[-1]), 1, generator=generator)
        idx = idx.view(*probs.shape[:-1], 1)  # (B, Lq, 1)
        weights = torch.zeros_like(probs).scatter_(-1, idx, 1.0) * has_key
        log_prob = scores.gather(-1, idx).squeeze(-1) - lse  # log softmax at the sample
        return weights, torch.where(has_key.squeeze(-1), log_prob, torch.zeros_like(log_prob))


def _example():
    g = torch.Generator().manual_seed(0)
    module = HardAttention(8, 6, 16, mode="stochastic")
    return module, (torch.randn(2, 5, 8, generator=g), torch.randn(2, 7, 6, generator=g))


def _count(t, s, module=None):
    b, lq, lk, a, dv = s["batch"], s["q_len"], s["kv_len"], s["hidden_dim"], value_dim_of(s)
    count_additive_score(t, s, lq, lk, a)
    t.ew("softmax and sampling", b * lq * lk, 6)
    soft = s["mode"] in ("soft", "gumbel") or (s["mode"] == "argmax" and s["straight_through"])
    t.mm("weights @ v", b, lq, lk, dv, grads=2 if soft else 1)  # a sampled one-hot has no gradient
    t.inter(b * lq * lk, b * lq * lk, b * lq * dv)


register(Entry("hard-attention", HardAttention, "Xu et al. 2015, arXiv:1502.03044, Sec. 4.1-4.2",
               "O(Lq Lk A)", "stochastic (REINFORCE), argmax and Gumbel-softmax hard attention; soft as baseline",
               family="module", example=_example,
               spec=Spec({**ADDITIVE_SIZES, "value_dim": None, "mode": "stochastic", "straight_through": False},
                         _count, lambda s, m: query_key_inputs(s, m, s["value_dim"]),
                         ADDITIVE_FORMULA + "; a sampled or argmax one-hot passes no gradient to the scores "
                         "through weights @ v", length=("q_len", "kv_len"),
                         make=lambda s: HardAttention(s["query_dim"], s["key_dim"], s["hidden_dim"], mode=s["mode"],
                                                      straight_through=s["straight_through"]).to(dtype_of(s)),
                         module_type=HardAttention,
                         config=lambda m: {"query_dim": m.f_att.query_dim, "key_dim": m.f_att.key_dim,
                                           "hidden_dim": m.f_att.v.shape[0], "mode": m.mode,
                                           "straight_through": m.straight_through})))
