"""Cost specs of the additive-family modules: additive, coverage, hard, Luong, pointer, derived-key attention.

Sizes: ``batch, q_len, kv_len``, the modules' own widths (``query_dim, key_dim, hidden_dim``
...), ``dtype``. The additive score ``v^T tanh(W_q q + W_k k)`` ends in a matrix-vector
product (``aten.mv``), which FlopCounterMode does not count: it is in ``other_flops``
(``2 B Lq Lk A`` plus the add and tanh), not in ``flops``.
"""

from __future__ import annotations

import functools

from ...nn.additive import AdditiveAttention
from ...nn.coverage import CoverageAttention
from ...nn.derived_key import DerivedKeyAttention
from ...nn.hard import HardAttention
from ...nn.luong import LuongAttention
from ...nn.pointer import PointerAttention
from .attention import attend
from .core import dtype_of
from .tally import Spec, dropout_of, randn

__all__ = ["SPECS"]

_SIZES = {"batch": 2, "q_len": 5, "kv_len": 7, "query_dim": 8, "key_dim": 6, "hidden_dim": 16, "dtype": "float32"}
_LENGTHS = ("q_len", "kv_len")


def _score_fn(q, k):  # a stand-in pairwise score: explain() only needs to see that the score is a function
    raise NotImplementedError


def _additive_score(t, s, lq, lk, a, label="scores"):
    """``W_q q`` and ``W_k k`` (counted products) and the uncounted ``tanh(.) @ v`` matrix-vector product."""
    b = s["batch"]
    t.mm(f"{label}: W_q q", 1, b * lq, s["query_dim"], a)
    t.mm(f"{label}: W_k k", 1, b * lk, s["key_dim"], a)
    t.ew(f"{label}: v^T tanh(W_q q + W_k k) (matrix-vector, not counted)", b * lq * lk * a, 4)
    t.inter(b * lq * a, b * lk * a)


def _qkv_inputs(s, module, value_dim=None):
    dt = dtype_of(s)
    args = [randn(s["batch"], s["q_len"], s["query_dim"], dtype=dt), randn(s["batch"], s["kv_len"], s["key_dim"],
                                                                         seed=1, dtype=dt)]
    if value_dim is not None:
        args.append(randn(s["batch"], s["kv_len"], value_dim, seed=2, dtype=dt))
    return module, tuple(args)


def _value_dim(s):
    return s["key_dim"] if s.get("value_dim") is None else s["value_dim"]


def _additive_count(t, s, module=None):
    b, lq, lk, a = s["batch"], s["q_len"], s["kv_len"], s["hidden_dim"]
    _additive_score(t, s, lq, lk, a)
    attend(t, "", b, 1, lq, lk, a, _value_dim(s), dtype=dtype_of(s), pairwise=False, score=_score_fn, scale=1.0,
           return_weights=s["need_weights"], dropout_p=dropout_of(module))
    t.io(b * lq * s["query_dim"], b * lk * s["key_dim"], a * (s["query_dim"] + s["key_dim"] + 1))


def _additive_inputs(s, module):
    fn, args = _qkv_inputs(s, module, s["value_dim"])
    return functools.partial(fn, need_weights=s["need_weights"]), args


def _coverage_count(t, s, module=None):
    b, lq, lk, a, dv = s["batch"], s["q_len"], s["kv_len"], s["hidden_dim"], _value_dim(s)
    t.mm("W_h h", 1, b * lk, s["key_dim"], a)
    t.mm("W_s s", 1, b * lq, s["query_dim"], a)
    t.ew("scores: v^T tanh(W_h h + W_s s + w_c c) (matrix-vector, not counted)", b * lq * lk * a, 6)
    t.ew("softmax, coverage update and loss", b * lq * lk, 8)
    t.mm("weights @ v (one step at a time)", b * lq, 1, lk, dv)
    t.inter(b * lk * a, b * lq * a, b * lq * lk, b * lq * dv)
    t.io(b * lq * s["query_dim"], b * lk * s["key_dim"])


def _hard_count(t, s, module=None):
    b, lq, lk, a, dv = s["batch"], s["q_len"], s["kv_len"], s["hidden_dim"], _value_dim(s)
    _additive_score(t, s, lq, lk, a)
    t.ew("softmax and sampling", b * lq * lk, 6)
    soft = s["mode"] in ("soft", "gumbel") or (s["mode"] == "argmax" and s["straight_through"])
    t.mm("weights @ v", b, lq, lk, dv, grads=2 if soft else 1)  # a sampled one-hot has no gradient
    t.inter(b * lq * lk, b * lq * lk, b * lq * dv)


def _luong_count(t, s, module=None):
    b, lq, lk, qd, kd = s["batch"], s["q_len"], s["kv_len"], s["query_dim"], s["key_dim"]
    a = s["hidden_dim"] or qd
    if s["score"] == "dot":
        t.mm("scores: h_t . h_s", b, lq, qd, lk)
    elif s["score"] == "general":
        t.mm("scores: h_t W_a", 1, b * lq, qd, kd)
        t.mm("scores: (h_t W_a) . h_s", b, lq, kd, lk)
    else:
        _additive_score(t, {**s, "hidden_dim": a}, lq, lk, a)
    if s["mode"] == "local-p":
        t.mm("centres: W_p h_t", 1, b * lq, qd, a)
        t.ew("centres: v_p^T tanh(W_p h_t) (matrix-vector, not counted) and sigmoid", b * lq * a, 3)
    t.ew("softmax, window and Gaussian", b * lq * lk, 9)
    t.mm("context: weights @ h_s", b, lq, lk, kd)
    t.mm("W_c [c_t; h_t]", 1, b * lq, kd + qd, s["out_dim"] or qd)
    t.inter(b * lq * lk, b * lq * lk, b * lq * kd, b * lq * (s["out_dim"] or qd))


def _pointer_count(t, s, module=None):
    b, lq, n, a = s["batch"], s["q_len"], s["kv_len"], s["hidden_dim"]
    t.mm("W_2 d (decoder)", 1, b * lq, s["decoder_dim"], a)
    t.mm("W_1 e (encoder)", 1, b * n, s["encoder_dim"], a)
    t.ew("u = v^T tanh(W_1 e + W_2 d) (matrix-vector, not counted)", b * lq * n * a, 4)
    t.ew("log-softmax", b * lq * n, 5)
    t.inter(b * lq * a, b * n * a, b * lq * n)


def _pointer_inputs(s, module):
    dt = dtype_of(s)
    return module, (randn(s["batch"], s["q_len"], s["decoder_dim"], dtype=dt),
                    randn(s["batch"], s["kv_len"], s["encoder_dim"], seed=1, dtype=dt))


def _derived_count(t, s, module=None):
    b, lq, n, dv, la = s["batch"], s["q_len"], s["kv_len"], s["value_dim"], s["attn_dim"]
    t.mm("keys: V W_a", 1, b * n, dv, la)
    t.ew("keys: tanh", b * n * la)
    t.inter(b * n * la)
    attend(t, "", b, 1, lq, n, la, dv, dtype=dtype_of(s), score="dot", scale=1.0, return_weights=True)


def _derived_inputs(s, module):
    dt = dtype_of(s)
    return module, (randn(s["batch"], s["kv_len"], s["value_dim"], dtype=dt),
                    randn(s["batch"], s["q_len"], s["attn_dim"], seed=1, dtype=dt))


def _dims(m):
    return {"query_dim": m.query_dim, "key_dim": m.key_dim}


_ADD = "W_q q, W_k k: 2 B (Lq Dq + Lk Dk) A; weights @ v: 2 B Lq Lk Dv; v^T tanh(.): 2 B Lq Lk A (other)"
SPECS = [
    Spec("additive", {**_SIZES, "value_dim": None, "need_weights": True}, _additive_count, _additive_inputs, _ADD,
         make=lambda s: AdditiveAttention(s["query_dim"], s["key_dim"], s["hidden_dim"]).to(dtype_of(s)),
         length=_LENGTHS, module_type=AdditiveAttention,
         config=lambda m: {**_dims(m), "hidden_dim": m.v.shape[0]}),
    Spec("coverage-attention", {**_SIZES, "value_dim": None}, _coverage_count,
         lambda s, m: _qkv_inputs(s, m, s["value_dim"]), _ADD + " (the score one step at a time)",
         make=lambda s: CoverageAttention(s["query_dim"], s["key_dim"], s["hidden_dim"]).to(dtype_of(s)),
         length=_LENGTHS, module_type=CoverageAttention, config=lambda m: {**_dims(m), "hidden_dim": m.v.shape[0]}),
    Spec("hard-attention", {**_SIZES, "value_dim": None, "mode": "stochastic", "straight_through": False},
         _hard_count, lambda s, m: _qkv_inputs(s, m, s["value_dim"]),
         _ADD + "; a sampled or argmax one-hot passes no gradient to the scores through weights @ v",
         make=lambda s: HardAttention(s["query_dim"], s["key_dim"], s["hidden_dim"], mode=s["mode"],
                                      straight_through=s["straight_through"]).to(dtype_of(s)),
         length=_LENGTHS, module_type=HardAttention,
         config=lambda m: {"query_dim": m.f_att.query_dim, "key_dim": m.f_att.key_dim,
                           "hidden_dim": m.f_att.v.shape[0], "mode": m.mode, "straight_through": m.straight_through}),
    Spec("luong", {**_SIZES, "hidden_dim": None, "out_dim": None, "score": "general", "mode": "local-p",
                   "window": 2},
         _luong_count, lambda s, m: _qkv_inputs(s, m),
         "scores (dot 2 B Lq Lk D | general + 2 B Lq Dq Dk | concat as additive); context 2 B Lq Lk Dk; "
         "W_c 2 B Lq (Dk + Dq) Dout; local-p centres 2 B Lq Dq A",
         make=lambda s: LuongAttention(s["query_dim"], s["key_dim"], score=s["score"], mode=s["mode"],
                                       window=s["window"], hidden_dim=s["hidden_dim"],
                                       out_dim=s["out_dim"]).to(dtype_of(s)),
         length=_LENGTHS, module_type=LuongAttention,
         config=lambda m: {**_dims(m), "score": m.score_name, "mode": m.mode, "window": m.window,
                           "out_dim": m.w_c.out_features,
                           "hidden_dim": (m.v_p.shape[0] if m.mode == "local-p" else
                                          m.concat.v.shape[0] if m.score_name == "concat" else m.query_dim)}),
    Spec("pointer", {"batch": 2, "q_len": 3, "kv_len": 7, "encoder_dim": 8, "decoder_dim": 6, "hidden_dim": 5,
                     "dtype": "float32"},
         _pointer_count, _pointer_inputs, "W_1 e, W_2 d: 2 B (n De + Lq Dd) A; v^T tanh(.): 2 B Lq n A (other)",
         make=lambda s: PointerAttention(s["encoder_dim"], s["decoder_dim"], s["hidden_dim"]).to(dtype_of(s)),
         length=_LENGTHS, module_type=PointerAttention,
         config=lambda m: {"encoder_dim": m.encoder_dim, "decoder_dim": m.decoder_dim, "hidden_dim": m.v.shape[0]}),
    Spec("derived-key", {"batch": 2, "q_len": 5, "kv_len": 7, "value_dim": 8, "attn_dim": 6, "dtype": "float32"},
         _derived_count, _derived_inputs, "keys 2 B n Dv La; attention 2 B Lq n (La + Dv)",
         make=lambda s: DerivedKeyAttention(s["value_dim"], s["attn_dim"]).to(dtype_of(s)),
         length=_LENGTHS, module_type=DerivedKeyAttention,
         config=lambda m: {"value_dim": m.value_dim, "attn_dim": m.attn_dim}),
]
