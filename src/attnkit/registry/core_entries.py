"""Registry entries for the core: scores, normalisers, masks and modifiers of :func:`attnkit.attention`.

Mechanism modules register themselves, with their cost specs, in their own files; this module
imports them so that :func:`attnkit.registry.entries` sees everything. Each core entry's spec is
an :func:`~attnkit.costing.attend.attention_spec` of the options it passes to attention(), and its
example runs those options at the spec's example sizes.
"""

from __future__ import annotations

import functools
import math

import torch

from .. import bias as bias_mod
from .. import masks
from .. import nn as _modules  # noqa: F401  (each mechanism file registers itself on import)
from ..core import attention
from ..costing.attend import attention_spec
from .entry import Entry, register

_LONGFORMER = ("Beltagy et al. 2020, arXiv:2004.05150, Sec. 5: window w = 512 in every layer of the pretrained "
               "model (w / 2 = 256 keys on each side); Sec. 3.1: global attention on the [CLS] token")


def _qkv(b=2, h=3, lq=16, lk=16, d=8, dv=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, lq, d, generator=g), torch.randn(b, h, lk, d, generator=g),
            torch.randn(b, h, lk, dv, generator=g))


def _core(name, paper, complexity, line, family="core", kwargs_of=lambda s: {}, **spec_kw):
    spec = attention_spec(kwargs_of, **spec_kw)
    example_sizes = spec.resolve({})

    def example():
        return functools.partial(attention, **kwargs_of(example_sizes)), _qkv()
    register(Entry(name, attention, paper, complexity, line, family, example, spec=spec))


_DENSE = "O(Lq Lk D)"
_CHILD = "Child et al. 2019, arXiv:1904.10509, Sec. 4.2"
_core("scaled-dot-product", "Vaswani et al. 2017, arXiv:1706.03762, eq. 1", _DENSE,
      "softmax(q k^T / sqrt(D)) v", "score")
_core("dot-product", "Luong et al. 2015, arXiv:1508.04025, eq. 8 (dot)", _DENSE,
      "softmax(q k^T) v, no scaling", "score", lambda s: {"score": "dot"})
_core("cosine", "Graves et al. 2014, arXiv:1410.5401, eq. 6 (content addressing)", _DENSE,
      "softmax(scale * cos(q, k)) v", "score", lambda s: {"score": "cosine", "scale": 10.0})
_core("sparsemax", "Martins & Astudillo 2016, arXiv:1602.02068", _DENSE + " log Lk",
      "Euclidean projection onto the simplex: sparse weights", "normalize", lambda s: {"normalize": "sparsemax"})
_SIGMOID = "Ramapuram et al. 2024, arXiv:2409.04431, Sec. 2"
_core("sigmoid", _SIGMOID, _DENSE, "elementwise sigmoid weights, no normalisation; O(L) memory on the chunked path",
      "normalize", lambda s: {"normalize": "sigmoid"})
_core("sigmoid-log-n", _SIGMOID, _DENSE, "sigmoid(s - log n): the paper's bias for n keys; O(L) memory chunked",
      "normalize", lambda s: {"normalize": "sigmoid_log_n"})
_core("softpick", "Zuhri et al. 2025, arXiv:2504.20966", _DENSE,
      "ReLU(e^s - 1) / (sum |e^s - 1| + eps): rectified, not sum-to-one; O(L) memory chunked", "normalize",
      lambda s: {"normalize": "softpick"})
_core("stick-breaking", "Tan et al. 2024, arXiv:2410.17980, Sec. 2", _DENSE,
      "each key takes sigmoid(s) of what the nearer keys left; O(L) memory chunked", "normalize",
      lambda s: {"normalize": "stick_breaking", "mask": masks.causal()})
_core("attention-sinks", "OpenAI 2025, arXiv:2508.10925 (gpt-oss); Xiao et al. 2023, arXiv:2309.17453", _DENSE,
      "softmax([scores, s_h])[:-1] v: a learned logit per head takes weight and gives no value", "normalize",
      lambda s: {"sinks": torch.full((s["heads"],), 1.0), "mask": masks.causal()})
_core("hard-argmax", "Xu et al. 2015, arXiv:1502.03044, Sec. 4.1 (deterministic form)", _DENSE,
      "one-hot at the best key, straight-through gradient", "normalize", lambda s: {"normalize": "hard"})
_core("gumbel-softmax", "Jang et al. 2017, arXiv:1611.01144", _DENSE,
      "stochastic relaxed one-hot weights", "normalize", lambda s: {"normalize": "gumbel"})
_core("causal", "Vaswani et al. 2017, arXiv:1706.03762, Sec. 3.2.3", "O(Lq Lk D / 2)",
      "each query sees itself and the past", "mask", lambda s: {"mask": masks.causal()})
_core("sliding-window", "Beltagy et al. 2020, arXiv:2004.05150, Sec. 3.1", "O(L w D)",
      "local attention within a window of keys", "mask",
      lambda s: {"mask": masks.sliding_window(s["window"], s["window"])}, window=4,
      at_scale={"window": 256}, source=_LONGFORMER)
_core("dilated-window", "Beltagy et al. 2020, arXiv:2004.05150, Sec. 3.1", "O(L w D)",
      "every d-th key within a window", "mask", lambda s: {"mask": masks.dilated(s["window"], s["dilation"])},
      window=2, dilation=2)
_core("sparse-strided", _CHILD, "O(L sqrt(L) D)", "local band plus every stride-th key", "mask",
      lambda s: {"mask": masks.strided(s["stride"]) & masks.causal()}, stride=4,
      at_scale={"stride": None}, source=_CHILD + ": stride l = sqrt(n)", nullable=frozenset({"stride"}),
      derive=lambda s: {**s, "stride": s["stride"] or max(1, math.isqrt(s["q_len"]))})
_core("sparse-fixed", _CHILD, "O(L sqrt(L) D)", "own block plus summary positions of every block", "mask",
      lambda s: {"mask": masks.fixed(s["stride"], s["summary"]) & masks.causal()}, stride=4, summary=1,
      at_scale={"stride": 128, "summary": None}, nullable=frozenset({"summary"}),
      source=_CHILD + ": c in {8, 16, 32} for l in {128, 256}; c = l / 16 here",
      derive=lambda s: {**s, "summary": s["summary"] or max(1, s["stride"] // 16)})
_core("global-tokens", "Beltagy et al. 2020, arXiv:2004.05150, Sec. 3.1", "O(L (w + g) D)",
      "chosen positions see and are seen by all", "mask",
      lambda s: {"mask": masks.global_tokens(list(range(s["globals"]))) | masks.sliding_window(s["window"],
                                                                                               s["window"])},
      globals=1, window=2, at_scale={"window": 256}, source=_LONGFORMER)
_core("prefix-lm", "Raffel et al. 2020, arXiv:1910.10683, Sec. 3.2.1", _DENSE,
      "bidirectional prefix, causal continuation", "mask", lambda s: {"mask": masks.prefix_lm(s["prefix"])},
      prefix=4)
_core("segment-level", "Krell et al. 2021, arXiv:2107.02027 (packing)", "O(sum_s L_s^2 D)",
      "tokens attend within their own segment", "mask",
      lambda s: {"mask": masks.segments(torch.arange(s["q_len"]) // s["segment"],
                                        torch.arange(s["kv_len"]) // s["segment"])}, segment=5, sized_mask=True)
_core("alibi", "Press et al. 2022, arXiv:2108.12409", _DENSE,
      "per-head linear distance penalty", "bias",
      lambda s: {"mask": masks.causal(), "bias": bias_mod.alibi(s["heads"])})
_core("softcap", "Gemma Team 2024, arXiv:2408.00118", _DENSE,
      "cap * tanh(scores / cap)", "bias", lambda s: {"bias": bias_mod.softcap(s["cap"])}, cap=5.0)
