"""Cost specs of the pooling-family modules: memory, co-attention, attention pooling, HAN, segment, tiered.

Sizes: ``batch``, the lengths each module reads (``length``; ``q_len``/``kv_len`` for
question/image or query/tokens; ``sentences, words`` for HAN), its widths, ``dtype``.
Masks are taken as all-true (full sequences). Calls of :func:`attnkit.attention` on
constant queries/keys (a mean, or weights given as a bias) pass no gradient through
their score product; their backward counts only what needs a gradient.
"""

from __future__ import annotations

import torch

from ...errors import ArgumentError
from ...nn.coattention import CoAttention
from ...nn.memory import MemoryAttention
from ...nn.pooling import AttentionPooling, HierarchicalAttention
from ...nn.segment import SegmentAttention, TieredAttention
from .attention import attend
from .core import dtype_of
from .tally import Spec, randn, zeros

__all__ = ["SPECS"]

_DOT = {"score": "dot", "scale": 1.0, "return_weights": True}


def _on(*shape):
    """An all-true stand-in mask of ``shape`` (for the dispatcher's decision)."""
    return torch.ones((), dtype=torch.bool).expand(*shape)


def _pool(t, label, b, lq, lk, d, dv, dt):
    """:func:`attnkit.nn.coattention._pool` / AttentionPooling: a learned query over ``lk`` rows."""
    attend(t, label, b, 1, lq, lk, d, dv, dtype=dt, **_DOT)


def _mean(t, label, b, groups, n, dv, dt):
    """A mean per group as attention with zero queries and keys: only ``weights @ x`` has a gradient."""
    attend(t, label, b, 1, groups, n, 1, dv, dtype=dt, grads=(False, False, True), mask=_on(1, 1, groups, n), **_DOT)


def _memory_count(t, s, module=None):
    b, steps, d, k = s["batch"], s["length"], s["dim"], s["memory_size"]
    t.mm("slot scores: h W_m^T", 1, b * steps, d, k)
    t.ew("state score: h . w_mh (matrix-vector, not counted)", b * steps * d, 2)
    t.inter(b * steps * k, b * steps * k * d)
    attend(t, "", b * steps, 1, 1, k, 1, d, dtype=dtype_of(s), grads=(False, False, True), weights_grad=True,
           bias=zeros(dtype_of(s), b * steps, 1, 1, k), mask=_on(b * steps, 1, 1, k), **_DOT)


def _co_parallel(t, s, dt):
    b, lq, lv, dq, dv, k = s["batch"], s["q_len"], s["kv_len"], s["question_dim"], s["image_dim"], s["hidden_dim"]
    t.mm("affinity: Q W_b", 1, b * lq, dq, dv)
    t.mm("affinity: (Q W_b) V^T", b, lq, dv, lv)
    t.mm("W_q Q, W_v V", 1, b * lq, dq, k)
    t.mm("W_q Q, W_v V", 1, b * lv, dv, k)
    t.mm("C^T (W_q Q), C (W_v V)", 2 * b, lv, lq, k)
    t.inter(b * lq * lv, b * (lq + lv) * k * 2)
    _pool(t, "image pooling: ", b, 1, lv, k, dv, dt)
    _pool(t, "question pooling: ", b, 1, lq, k, dq, dt)


def _co_alternating(t, s, dt):
    b, lq, lv, dq, dv, k = s["batch"], s["q_len"], s["kv_len"], s["question_dim"], s["image_dim"], s["hidden_dim"]
    t.mm("projections of Q and V", 2, b * lq, dq, k)
    t.mm("projections of Q and V", 1, b * lv, dv, k)
    t.mm("projections of the guides", 1, b, dq, k)
    t.mm("projections of the guides", 1, b, dv, k)
    t.inter(2 * b * lq * k, b * lv * k)
    for label, n, width in (("step 1", lq, dq), ("step 2", lv, dv), ("step 3", lq, dq)):
        _pool(t, f"{label}: ", b, 1, n, k, width, dt)


def _co_count(t, s, module=None):
    (_co_parallel if s["mode"] == "parallel" else _co_alternating)(t, s, dtype_of(s))


def _co_inputs(s, module):
    dt = dtype_of(s)
    return module, (randn(s["batch"], s["q_len"], s["question_dim"], dtype=dt),
                    randn(s["batch"], s["kv_len"], s["image_dim"], seed=1, dtype=dt))


def _pooling_count(t, s, module=None):
    b, n, d, a = s["batch"], s["length"], s["dim"], s["attn_dim"]
    t.mm("u = tanh(W h + b)", 1, b * n, d, a)
    t.inter(b * n * a)
    _pool(t, "", b, 1, n, a, d, dtype_of(s))


def _gru(t, label, sequences, steps, fan_in, hidden):
    """A bidirectional GRU over full sequences: input products once, hidden products per step.

    The first step of each direction multiplies the zero initial state, which needs no gradient.
    """
    tokens = sequences * steps
    for direction in ("forward", "backward"):
        t.mm(f"{label} GRU ({direction}): inputs", 1, tokens, fan_in, 3 * hidden)
        t.mm(f"{label} GRU ({direction}): hidden state", 1, tokens - sequences, hidden, 3 * hidden)
        t.mm(f"{label} GRU ({direction}): hidden state", 1, sequences, hidden, 3 * hidden, grads=1)
        t.ew(f"{label} GRU ({direction}): gates", tokens * hidden, 12)
        t.inter(tokens * hidden)


def _han_count(t, s, module=None):
    b, ns, nw, dt = s["batch"], s["sentences"], s["words"], dtype_of(s)
    word_dim = s["hidden_dim"] if s["word_encoder"] == "gru" else s["input_dim"]
    out_dim = s["hidden_dim"] if s["sentence_encoder"] == "gru" else word_dim
    a_word = s["attn_dim"] or word_dim
    a_sent = s["attn_dim"] or out_dim
    if s["word_encoder"] == "gru":
        _gru(t, "word", b * ns, nw, s["input_dim"], s["hidden_dim"] // 2)
    t.mm("word pooling: tanh(W h + b)", 1, b * ns * nw, word_dim, a_word)
    _pool(t, "word pooling: ", b * ns, 1, nw, a_word, word_dim, dt)
    if s["sentence_encoder"] == "gru":
        _gru(t, "sentence", b, ns, word_dim, s["hidden_dim"] // 2)
    t.mm("sentence pooling: tanh(W h + b)", 1, b * ns, out_dim, a_sent)
    _pool(t, "sentence pooling: ", b, 1, ns, a_sent, out_dim, dt)


def _han_config(m):
    from ...nn.pooling import _BiGRU

    def kind(encoder):
        if encoder is None or isinstance(encoder, _BiGRU):
            return "identity" if encoder is None else "gru"
        raise ArgumentError("cost: hierarchical-attention with a custom encoder module has no cost formula")
    word, sentence = kind(m.word_encoder), kind(m.sentence_encoder)
    word_dim, a_word, a_sent = m.word_attention.dim, m.word_attention.proj.out_features, \
        m.sentence_attention.proj.out_features
    default = a_word == word_dim and a_sent == m.output_dim
    return {"input_dim": m.input_dim, "hidden_dim": word_dim if word == "gru" else m.output_dim,
            "attn_dim": None if default else a_word, "word_encoder": word, "sentence_encoder": sentence}


def _han_inputs(s, module):
    return module, (randn(s["batch"], s["sentences"], s["words"], s["input_dim"], dtype=dtype_of(s)),)


def _segment_count(t, s, module=None):
    b, lq, n, d, groups, dt = s["batch"], s["q_len"], s["length"], s["dim"], s["segments"], dtype_of(s)
    attentive = s["pool"] == "attention"
    if attentive:
        t.mm("pooling: tanh(W x + b)", 1, b * n, d, d)
        attend(t, "pooling: ", b, 1, groups, n, d, d, dtype=dt, mask=_on(1, 1, groups, n), **_DOT)
    else:
        _mean(t, "pooling (mean): ", b, groups, n, d, dt)
    t.mm("projections: W_q q", 1, b * lq, s["query_dim"] or d, d)
    t.mm("projections: W_k g, W_v g", 2, b * groups, d, d)
    attend(t, "segments: ", b, 1, lq, groups, d, d, dtype=dt, mask=_on(1, 1, 1, groups), return_weights=True)
    t.mm("token weights: alpha @ beta", b, lq, groups, n, grads=1 + attentive)


def _tiered_count(t, s, module=None):
    b, lq, n, d, groups, dt = s["batch"], s["q_len"], s["length"], s["dim"], s["groups"], dtype_of(s)
    t.mm("projections: W_q q", 1, b * lq, s["query_dim"] or d, d)
    t.mm("projections: W_k x, W_v x", 2, b * n, d, d)
    _mean(t, "group keys (mean): ", b, groups, n, d, dt)
    t.mm("group scores: q . mean key", b, lq, d, groups)
    t.mm("token scores: q . k", b, lq, d, n)
    t.ew("group softmax, top-k and within-group log-sum-exp", b * lq * (n + groups), 12)
    t.inter(b * lq * groups, b * lq * n)
    attend(t, "tokens: ", b, 1, lq, n, 1, d, dtype=dt, grads=(False, False, True), weights_grad=True,
           bias=zeros(dt, b, 1, lq, n), mask=_on(b, 1, lq, n), **_DOT)


def _segment_inputs(s, module):
    dt = dtype_of(s)
    n = s["length"]
    ids = torch.arange(n) * s["segments" if "segments" in s else "groups"] // max(n, 1)
    return module, (randn(s["batch"], s["q_len"], s["query_dim"] or s["dim"], dtype=dt),
                    randn(s["batch"], n, s["dim"], seed=1, dtype=dt), ids)


def _segment_make(s):
    return SegmentAttention(s["dim"], query_dim=s["query_dim"], pool=s["pool"]).to(dtype_of(s))


_SEG = {"batch": 2, "q_len": 4, "length": 9, "dim": 8, "query_dim": None, "dtype": "float32"}
_POOL = "scores 2 B Lq n A, weights @ x 2 B Lq n D"
SPECS = [
    Spec("memory-attention", {"batch": 2, "length": 9, "dim": 8, "memory_size": 4, "dtype": "float32"},
         _memory_count, lambda s, m: (m, (randn(s["batch"], s["length"], s["dim"], dtype=dtype_of(s)),)),
         "slot scores 2 B T D K; weights @ slots 2 B T K D",
         make=lambda s: MemoryAttention(s["dim"], s["memory_size"]).to(dtype_of(s)), module_type=MemoryAttention,
         config=lambda m: {"dim": m.dim, "memory_size": m.memory_size}),
    *(Spec(f"co-attention-{mode}", {"batch": 2, "q_len": 4, "kv_len": 9, "question_dim": 6, "image_dim": 8,
                                    "hidden_dim": 5, "mode": mode, "dtype": "float32"},
           _co_count, _co_inputs, "affinity 2 B T (Dq Dv + Dv N) + projections 2 B (T Dq + N Dv) k + pooling"
           if mode == "parallel" else "projections 2 B (2 T Dq + N Dv) k + three pooling steps",
           make=lambda s: CoAttention(s["question_dim"], s["image_dim"], s["hidden_dim"],
                                      mode=s["mode"]).to(dtype_of(s)),
           length=("q_len", "kv_len"), module_type=CoAttention, matches=lambda m, mode=mode: m.mode == mode,
           config=lambda m: {"question_dim": m.question_dim, "image_dim": m.image_dim, "mode": m.mode,
                             "hidden_dim": (m.question_proj if m.mode == "parallel" else m.step1_x).out_features})
      for mode in ("parallel", "alternating")),
    Spec("attention-pooling", {"batch": 2, "length": 7, "dim": 8, "attn_dim": 6, "dtype": "float32"},
         _pooling_count, lambda s, m: (m, (randn(s["batch"], s["length"], s["dim"], dtype=dtype_of(s)),)),
         "u = tanh(W h + b): 2 B n D A; " + _POOL,
         make=lambda s: AttentionPooling(s["dim"], s["attn_dim"]).to(dtype_of(s)), module_type=AttentionPooling,
         config=lambda m: {"dim": m.dim, "attn_dim": m.proj.out_features}),
    Spec("hierarchical-attention", {"batch": 2, "sentences": 3, "words": 5, "input_dim": 8, "hidden_dim": 6,
                                    "attn_dim": None, "word_encoder": "gru", "sentence_encoder": "gru",
                                    "dtype": "float32"},
         _han_count, _han_inputs, "per level: BiGRU 2 x 2 tokens (in + h) 3h, pooling 2 tokens D A + " + _POOL,
         make=lambda s: HierarchicalAttention(s["input_dim"], s["hidden_dim"], attn_dim=s["attn_dim"],
                                              word_encoder=s["word_encoder"],
                                              sentence_encoder=s["sentence_encoder"]).to(dtype_of(s)),
         length=("words",), module_type=HierarchicalAttention, config=_han_config),
    Spec("segment-attention", {**_SEG, "segments": 3, "pool": "mean"}, _segment_count, _segment_inputs,
         "pooling 2 B S n (1 + D); projections 2 B (Lq Dq + 2 S D) D; attention 2 B Lq S 2D; tokens 2 B Lq S n",
         make=_segment_make, module_type=SegmentAttention,
         config=lambda m: {"dim": m.dim, "query_dim": m.query_dim,
                           "pool": "mean" if m.pooler is None else "attention"}),
    Spec("tiered-attention", {**_SEG, "groups": 3, "top_k": 2}, _tiered_count, _segment_inputs,
         "projections 2 B (Lq Dq + 2 n D) D; group keys 2 B G n (1 + D); scores 2 B Lq (G + n) D; "
         "weights @ v 2 B Lq n (1 + D)",
         make=lambda s: TieredAttention(s["dim"], query_dim=s["query_dim"], top_k=s["top_k"]).to(dtype_of(s)),
         module_type=TieredAttention, nullable=frozenset({"top_k"}),
         config=lambda m: {"dim": m.dim, "query_dim": m.query_dim, "top_k": m.top_k}),
]
