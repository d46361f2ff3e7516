"""Attention whose keys are computed from the values (Brown et al. 2018)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ..core import attention
from ..costing.attend import attend
from ..costing.spec import Spec
from ..costing.tally import dtype_of, randn
from ..errors import ArgumentError
from ..registry.entry import Entry, register
from ._inputs import check_key_mask, check_sequence, check_shape

__all__ = ["DerivedKeyAttention", "DerivedKeyOutput"]

_WHO = "DerivedKeyAttention"


class DerivedKeyOutput(NamedTuple):
    """output ``a`` ``(B, [Lq,] Dv)``; weights ``d`` ``(B, [Lq,] n)``."""

    output: torch.Tensor
    weights: torch.Tensor


class DerivedKeyAttention(nn.Module):
    """Dot-product attention whose keys are a learned function of the values.

    Brown, Tuor, Hutchinson & Nichols 2018, "Recurrent Neural Network Attention
    Mechanisms for Interpretable System Log Anomaly Detection", MLCS workshop,
    arXiv:1803.04967, eqs. 5-7::

        K = tanh(V W_a),   d = softmax(q K^T),   a = d V

    Notation: ``V`` = ``value`` (the RNN's hidden states), ``W_a`` =
    ``key_proj.weight^T``, ``q`` = ``query`` (or the learned ``self.query`` for the
    paper's "fixed" attention), ``d`` = ``weights``, ``a`` = ``output``.

    Differences from the paper: several queries at once (``Lq``) and a batch; masks
    (a row with no allowed value gives output 0 and weights 0); an optional bias in
    ``W_a`` (``bias=True``; the paper has none). How ``q`` is produced (fixed,
    per-position "syntax" or input-dependent "semantic" queries) is left to the caller,
    except the fixed one, which ``learned_query=True`` provides.

    Shapes:
        value ``(B, n, value_dim)``; query ``(B, attn_dim)`` or ``(B, Lq, attn_dim)``
        (None with ``learned_query``: one query) -> output ``(B, [Lq,] value_dim)``,
        weights ``(B, [Lq,] n)``. mask: bool ``(B, n)`` or ``(B, Lq, n)``, or an
        :mod:`attnkit.masks` mask (e.g. ``causal()``), True = attend.

    Complexity: ``O(B n value_dim attn_dim)`` for the keys, ``O(B Lq n (attn_dim + value_dim))`` for attention.

    Args:
        value_dim: features of a value (``V``'s rows).
        attn_dim: the attention dimension ``La`` of keys and queries.
        learned_query: hold a learned query vector, used when ``query`` is None.
        bias: add a learned bias inside the tanh.

    Example:
        >>> import torch
        >>> from attnkit.nn.derived_key import DerivedKeyAttention
        >>> _ = torch.manual_seed(0)
        >>> attn = DerivedKeyAttention(6, 4, learned_query=True)
        >>> out, weights = attn(torch.randn(2, 5, 6))
        >>> out.shape, weights.shape
        (torch.Size([2, 6]), torch.Size([2, 5]))
        >>> out, weights = attn(torch.randn(2, 5, 6), torch.randn(2, 3, 4), mask=torch.ones(2, 5, dtype=torch.bool))
        >>> out.shape, weights.shape
        (torch.Size([2, 3, 6]), torch.Size([2, 3, 5]))
    """

    def __init__(self, value_dim: int, attn_dim: int, *, learned_query: bool = False, bias: bool = False):
        super().__init__()
        self.value_dim, self.attn_dim = value_dim, attn_dim
        self.key_proj = nn.Linear(value_dim, attn_dim, bias=bias)
        self.query = nn.Parameter(torch.randn(attn_dim) * attn_dim ** -0.5) if learned_query else None

    def keys(self, value: torch.Tensor) -> torch.Tensor:
        """``K = tanh(V W_a)``, ``(B, n, attn_dim)``."""
        return torch.tanh(self.key_proj(value))

    def _queries(self, query, batch):
        if query is None:
            if self.query is None:
                raise ArgumentError(f"{_WHO}: query is required unless the module was built with learned_query=True")
            return self.query.expand(batch, 1, -1), True
        check_shape(_WHO, "query", query, lambda t: t.dim() in (2, 3) and t.shape[-1] == self.attn_dim
                    and t.shape[0] == batch,
                    f"have shape (batch, {self.attn_dim}) or (batch, Lq, {self.attn_dim}) with batch={batch}")
        return (query[:, None, :], True) if query.dim() == 2 else (query, False)

    def forward(self, value: torch.Tensor, query: torch.Tensor | None = None, *, mask=None) -> DerivedKeyOutput:
        """Attend over ``value`` with keys derived from it; see the class docstring for shapes."""
        check_sequence(_WHO, "value", value, self.value_dim, like=self)
        q, single = self._queries(query, value.shape[0])  # (B, Lq, La)
        allowed = check_key_mask(_WHO, "mask", mask, value.shape[0], q.shape[1], value.shape[1], masks_too=True)
        out = attention(q.to(value.dtype), self.keys(value), value, mask=allowed, score="dot", scale=1.0,
                        return_weights=True)
        if single:
            return DerivedKeyOutput(out.output[:, 0], out.weights[:, 0])
        return DerivedKeyOutput(out.output, out.weights)


def _example():
    g = torch.Generator().manual_seed(0)
    return DerivedKeyAttention(8, 6), (torch.randn(2, 7, 8, generator=g), torch.randn(2, 5, 6, generator=g))


def _count(t, s, module=None):
    b, lq, n, dv, la = s["batch"], s["q_len"], s["kv_len"], s["value_dim"], s["attn_dim"]
    t.mm("keys: V W_a", 1, b * n, dv, la)
    t.ew("keys: tanh", b * n * la)
    t.inter(b * n * la)
    attend(t, "", b, 1, lq, n, la, dv, dtype=dtype_of(s), score="dot", scale=1.0, return_weights=True)


def _inputs(s, module):
    dt = dtype_of(s)
    return module, (randn(s["batch"], s["kv_len"], s["value_dim"], dtype=dt),
                    randn(s["batch"], s["q_len"], s["attn_dim"], seed=1, dtype=dt))


register(Entry("derived-key", DerivedKeyAttention,
               "Brown et al. 2018, arXiv:1803.04967, eqs. 5-7", "O(Lq n (La + Dv) + n Dv La)",
               "keys computed from the values: softmax(q tanh(V W_a)^T) V", family="module", example=_example,
               spec=Spec({"batch": 2, "q_len": 5, "kv_len": 7, "value_dim": 8, "attn_dim": 6, "dtype": "float32"},
                         _count, _inputs, "keys 2 B n Dv La; attention 2 B Lq n (La + Dv)",
                         length=("q_len", "kv_len"), module_type=DerivedKeyAttention,
                         make=lambda s: DerivedKeyAttention(s["value_dim"], s["attn_dim"]).to(dtype_of(s)),
                         config=lambda m: {"value_dim": m.value_dim, "attn_dim": m.attn_dim})))
