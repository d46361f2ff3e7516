"""Additive (Bahdanau, "concat") attention, and the helpers the additive family shares.

The tiled score kernel lives in :mod:`.additive_scores` (re-exported here as ``additive_scores``).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import nn

from ..core import attention
from ..costing.attend import attend
from ..costing.spec import Spec
from ..costing.tally import dropout_of, dtype_of, randn
from ..errors import ArgumentError
from ..functional.validate import validate
from ..registry.entry import Entry, register
from ._inputs import check_memory, check_sequence
from .additive_scores import DEFAULT_MAX_ELEMENTS, additive_scores
from .padding import clear_padding

__all__ = ["AdditiveAttention", "AdditiveOutput", "additive_scores", "dense_allowed", "padded_keys",
           "drop_unseen", "DEFAULT_MAX_ELEMENTS"]


def dense_allowed(mask, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
    """A mask (an :mod:`attnkit.masks` mask or bool tensor, True = attend) as a bool ``(B|1, Lq|1, Lk)``.

    Validated exactly as :func:`attnkit.attention` validates ``mask=`` for 3-D inputs.
    """
    if mask is None:
        return None
    p = validate(query[..., :0], key[..., :0], key[..., :0], mask=mask, score="dot")  # features play no part
    b, _, lq, lk, _, _ = p.sizes
    return p.mask.materialize(lq, lk, batch=b, heads=1, device=query.device)[:, 0]


def drop_unseen(allowed: torch.Tensor | None, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Zero the key rows ``(B, Lk, .)`` that ``allowed (B|1, Lq|1, Lk)`` hides from every query.

    Done before scoring, so NaN/inf in padding reaches neither the output nor the
    gradients through ``0 * NaN`` (RELIABILITY row 22).
    """
    if allowed is None:
        return tensors
    hidden = ~allowed.any(-2)[..., None]  # (B|1, Lk, 1)
    return tuple(t.masked_fill(hidden, 0.0) for t in tensors)


def padded_keys(mask, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
    """The keys a mask hides from every query whatever the query (padding) as ``(B|1, 1, Lk)``, else None.

    ``O(B Lk)``: never builds the ``(Lq, Lk)`` picture, unlike :func:`dense_allowed`.
    """
    if mask is None:
        return None
    keys = validate(query[..., :0], key[..., :0], key[..., :0], mask=mask, score="dot").mask.key_padding()
    if keys is None:
        return None
    return keys.materialize(1, key.shape[1], batch=key.shape[0], heads=1, device=key.device)[:, 0]


class AdditiveOutput(NamedTuple):
    """context ``(B, Lq, Dv)``; weights ``(B, Lq, Lk)`` (None unless asked)."""

    context: torch.Tensor
    weights: torch.Tensor | None


class AdditiveAttention(nn.Module):
    """Additive attention: ``softmax_j(v^T tanh(W_q q_i + W_k k_j)) @ value``.

    Bahdanau, Cho & Bengio 2015, "Neural Machine Translation by Jointly Learning to
    Align and Translate", ICLR, arXiv:1409.0473, eqs. 5-6 and Appendix A.1.2::

        e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j),   alpha_ij = softmax_j(e_ij),   c_i = sum_j alpha_ij h_j

    This is also Luong et al.'s "concat" score, ``v_a^T tanh(W_a [h_t; h_s])``.
    Notation: ``s_{i-1}`` = ``query[:, i]``, ``h_j`` = ``key[:, j]`` (and ``value[:, j]``),
    ``W_a`` = ``query_proj.weight``, ``U_a`` = ``key_proj.weight``, ``v_a`` = ``v``.

    Differences from the paper: queries are given as a tensor (all decoder steps at
    once, or one step with ``Lq = 1``) instead of coming from the decoder's recurrence;
    masks; optional bias inside the tanh (``bias=True``); dropout on the weights.

    Memory: the ``(B, Lq, Lk, hidden)`` tensor is built a tile at a time in one reused
    buffer, forward and backward (see :func:`additive_scores`); with ``need_weights=False``
    the chunked kernel is allowed too, so nothing of size ``Lq x Lk`` need exist at once.
    At B=32, Lq=Lk=512, hidden=256 the forward peaks near 0.2 GiB where the broadcast
    ``tanh(q[:, :, None] + k[:, None]) @ v`` holds 16 GiB. The tiles evaluate no ``tanh``
    (``exp(-2q)`` and ``exp(-2k)`` once, then a multiply-add and a reciprocal per element,
    see :mod:`attnkit.nn.additive_scores`): at B=4, Lq=Lk=512, hidden=256 on one core the
    forward takes 0.07x and forward+backward 0.1x the broadcast's time.

    Shapes:
        query ``(B, Lq, query_dim)``, key ``(B, Lk, key_dim)``, value ``(B, Lk, Dv)``
        (default: key) -> context ``(B, Lq, Dv)``, weights ``(B, Lq, Lk)``.

    Complexity: ``O(B Lq Lk hidden)`` time; ``O(max_elements)`` extra memory for the scores' hidden tensor.

    Args:
        query_dim: features of a query (decoder state).
        key_dim: features of a key (annotation); default ``query_dim``.
        hidden_dim: size of ``v_a`` (the hidden layer); default ``query_dim``.
        bias: add a learned bias inside the tanh.
        dropout: dropout on the weights, applied only in training (returned weights are pre-dropout).
        max_elements: hidden-tensor elements built at once.

    Example:
        >>> import torch
        >>> from attnkit.nn.additive import AdditiveAttention
        >>> _ = torch.manual_seed(0)
        >>> attn = AdditiveAttention(4, 6, 8)
        >>> context, weights = attn(torch.randn(2, 3, 4), torch.randn(2, 5, 6))
        >>> context.shape, weights.shape
        (torch.Size([2, 3, 6]), torch.Size([2, 3, 5]))
        >>> torch.allclose(weights.sum(-1), torch.ones(2, 3))
        True
    """

    def __init__(self, query_dim: int, key_dim: int | None = None, hidden_dim: int | None = None, *,
                 bias: bool = False, dropout: float = 0.0, max_elements: int = DEFAULT_MAX_ELEMENTS):
        super().__init__()
        key_dim = query_dim if key_dim is None else key_dim
        hidden_dim = query_dim if hidden_dim is None else hidden_dim
        if not 0.0 <= dropout < 1.0:
            raise ArgumentError(f"AdditiveAttention: dropout must be in [0, 1); got {dropout!r}")
        if max_elements < 1:
            raise ArgumentError(f"AdditiveAttention: max_elements must be >= 1; got {max_elements!r}")
        self.query_dim, self.key_dim, self.dropout, self.max_elements = query_dim, key_dim, dropout, max_elements
        self.query_proj = nn.Linear(query_dim, hidden_dim, bias=bias)
        self.key_proj = nn.Linear(key_dim, hidden_dim, bias=False)
        self.v = nn.Parameter(torch.empty(hidden_dim).uniform_(-hidden_dim ** -0.5, hidden_dim ** -0.5))

    def score(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """Unmasked scores ``e`` of shape ``(B, Lq, Lk)``."""
        return additive_scores(self.query_proj(query), self.key_proj(key), self.v, max_elements=self.max_elements)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor | None = None, *,
                mask=None, need_weights: bool = True) -> AdditiveOutput:
        """Attend; ``mask`` is an :mod:`attnkit.masks` mask or bool tensor, True = attend.

        A query with no allowed key gets context 0 and weights 0.
        """
        value = key if value is None else value
        check_sequence("AdditiveAttention", "query", query, self.query_dim, length="length", like=self)
        check_sequence("AdditiveAttention", "key", key, self.key_dim, length="length", like=self)
        check_memory("AdditiveAttention", query, key, value)
        keep = padded_keys(mask, query, key)  # (B|1, 1, Lk) or None
        if keep is not None and query is key:  # self-attention: a padded key is a padded query too
            query = clear_padding(query, keep[:, 0])
        key, value = drop_unseen(keep, key, value)  # before W_k: no 0 * NaN in its grad
        fn = lambda q, k: additive_scores(q, k, self.v, max_elements=self.max_elements)
        out = attention(self.query_proj(query), self.key_proj(key), value, mask=mask, score=fn, scale=1.0,
                        dropout_p=self.dropout if self.training else 0.0, return_weights=need_weights)
        return AdditiveOutput(out.output, out.weights) if need_weights else AdditiveOutput(out, None)


def _example():
    g = torch.Generator().manual_seed(0)
    return AdditiveAttention(8, 6, 16), (torch.randn(2, 5, 8, generator=g), torch.randn(2, 7, 6, generator=g))


# Cost: the additive family's sizes are batch, q_len, kv_len, the modules' widths and dtype. The score
# v^T tanh(W_q q + W_k k) ends in a matrix-vector product (aten.mv), which FlopCounterMode does not
# count: it is in other_flops (2 B Lq Lk A plus the add and tanh), not in flops.
ADDITIVE_SIZES = {"batch": 2, "q_len": 5, "kv_len": 7, "query_dim": 8, "key_dim": 6, "hidden_dim": 16,
                  "dtype": "float32"}
ADDITIVE_FORMULA = ("W_q q, W_k k: 2 B (Lq Dq + Lk Dk) A; weights @ v: 2 B Lq Lk Dv; "
                    "v^T tanh(.): 2 B Lq Lk A (other)")


def _score_stand_in(q, k):  # a pairwise score function: the dispatcher only needs to see that it is one
    raise NotImplementedError


def count_additive_score(t, s, lq, lk, a, label="scores"):
    """``W_q q`` and ``W_k k`` (counted products) and the uncounted ``tanh(.) @ v`` matrix-vector product."""
    b = s["batch"]
    t.mm(f"{label}: W_q q", 1, b * lq, s["query_dim"], a)
    t.mm(f"{label}: W_k k", 1, b * lk, s["key_dim"], a)
    t.ew(f"{label}: v^T tanh(W_q q + W_k k) (matrix-vector, not counted)", b * lq * lk * a, 4)
    t.inter(b * lq * a, b * lk * a)


def query_key_inputs(s, module, value_dim=None):
    """``(module, (query (B, Lq, Dq), key (B, Lk, Dk)[, value (B, Lk, Dv)]))`` at the sizes ``s``."""
    dt = dtype_of(s)
    args = [randn(s["batch"], s["q_len"], s["query_dim"], dtype=dt),
            randn(s["batch"], s["kv_len"], s["key_dim"], seed=1, dtype=dt)]
    if value_dim is not None:
        args.append(randn(s["batch"], s["kv_len"], value_dim, seed=2, dtype=dt))
    return module, tuple(args)


def value_dim_of(s) -> int:
    return s["key_dim"] if s.get("value_dim") is None else s["value_dim"]


def _count(t, s, module=None):
    b, lq, lk, a = s["batch"], s["q_len"], s["kv_len"], s["hidden_dim"]
    count_additive_score(t, s, lq, lk, a)
    attend(t, "", b, 1, lq, lk, a, value_dim_of(s), dtype=dtype_of(s), pairwise=False, score=_score_stand_in,
           scale=1.0, return_weights=s["need_weights"], dropout_p=dropout_of(module))
    t.io(b * lq * s["query_dim"], b * lk * s["key_dim"], a * (s["query_dim"] + s["key_dim"] + 1))


def _inputs(s, module):
    fn, args = query_key_inputs(s, module, s["value_dim"])
    return functools.partial(fn, need_weights=s["need_weights"]), args


register(Entry("additive", AdditiveAttention, "Bahdanau et al. 2015, arXiv:1409.0473, eq. 6 and A.1.2",
               "O(Lq Lk A)", "v^T tanh(W_q q + W_k k) scores (also Luong's concat), memory-bounded",
               family="module", example=_example,
               spec=Spec({**ADDITIVE_SIZES, "value_dim": None, "need_weights": True}, _count, _inputs,
                         ADDITIVE_FORMULA, length=("q_len", "kv_len"), module_type=AdditiveAttention,
                         make=lambda s: AdditiveAttention(s["query_dim"], s["key_dim"],
                                                          s["hidden_dim"]).to(dtype_of(s)),
                         config=lambda m: {"query_dim": m.query_dim, "key_dim": m.key_dim,
                                           "hidden_dim": m.v.shape[0]})))
