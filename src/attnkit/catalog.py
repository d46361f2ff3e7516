"""Registry entries for the core: scores, normalisers, masks and modifiers of :func:`attnkit.attention`.

Mechanism modules register themselves in their own files; this module imports
them so that :func:`attnkit.registry.entries` sees everything.
"""

from __future__ import annotations

import functools

import torch

from . import bias as bias_mod
from . import masks
from . import nn as _modules  # noqa: F401  (each mechanism file registers itself on import)
from .core import attention
from .registry import Entry, register


def _qkv(b=2, h=3, lq=16, lk=16, d=8, dv=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, lq, d, generator=g), torch.randn(b, h, lk, d, generator=g),
            torch.randn(b, h, lk, dv, generator=g))


def _core(name, paper, complexity, summary, family="core", **kwargs):
    def example():
        return functools.partial(attention, **kwargs), _qkv()
    register(Entry(name, attention, paper, complexity, summary, family, example))


_DENSE = "O(Lq Lk D)"
_core("scaled-dot-product", "Vaswani et al. 2017, arXiv:1706.03762, eq. 1", _DENSE,
      "softmax(q k^T / sqrt(D)) v", "score")
_core("dot-product", "Luong et al. 2015, arXiv:1508.04025, eq. 8 (dot)", _DENSE,
      "softmax(q k^T) v, no scaling", "score", score="dot")
_core("cosine", "Graves et al. 2014, arXiv:1410.5401, eq. 6 (content addressing)", _DENSE,
      "softmax(scale * cos(q, k)) v", "score", score="cosine", scale=10.0)
_core("sparsemax", "Martins & Astudillo 2016, arXiv:1602.02068", _DENSE + " log Lk",
      "Euclidean projection onto the simplex: sparse weights", "normalize", normalize="sparsemax")
_core("sigmoid", "Ramapuram et al. 2024, arXiv:2409.04431", _DENSE,
      "elementwise sigmoid weights, no normalisation", "normalize", normalize="sigmoid")
_core("hard-argmax", "Xu et al. 2015, arXiv:1502.03044, Sec. 4.1 (deterministic form)", _DENSE,
      "one-hot at the best key, straight-through gradient", "normalize", normalize="hard")
_core("gumbel-softmax", "Jang et al. 2017, arXiv:1611.01144", _DENSE,
      "stochastic relaxed one-hot weights", "normalize", normalize="gumbel")
_core("causal", "Vaswani et al. 2017, arXiv:1706.03762, Sec. 3.2.3", "O(Lq Lk D / 2)",
      "each query sees itself and the past", "mask", mask=masks.causal())
_core("sliding-window", "Beltagy et al. 2020, arXiv:2004.05150, Sec. 3.1", "O(L w D)",
      "local attention within a window of keys", "mask", mask=masks.sliding_window(4, 4))
_core("dilated-window", "Beltagy et al. 2020, arXiv:2004.05150, Sec. 3.1", "O(L w D)",
      "every d-th key within a window", "mask", mask=masks.dilated(2, 2))
_core("sparse-strided", "Child et al. 2019, arXiv:1904.10509, Sec. 4.2", "O(L sqrt(L) D)",
      "local band plus every stride-th key", "mask", mask=masks.strided(4) & masks.causal())
_core("sparse-fixed", "Child et al. 2019, arXiv:1904.10509, Sec. 4.2", "O(L sqrt(L) D)",
      "own block plus summary positions of every block", "mask", mask=masks.fixed(4, 1) & masks.causal())
_core("global-tokens", "Beltagy et al. 2020, arXiv:2004.05150, Sec. 3.1", "O(L (w + g) D)",
      "chosen positions see and are seen by all", "mask",
      mask=masks.global_tokens([0]) | masks.sliding_window(2, 2))
_core("prefix-lm", "Raffel et al. 2020, arXiv:1910.10683, Sec. 3.2.1", _DENSE,
      "bidirectional prefix, causal continuation", "mask", mask=masks.prefix_lm(4))
_core("segment-level", "Krell et al. 2021, arXiv:2107.02027 (packing)", "O(sum_s L_s^2 D)",
      "tokens attend within their own segment", "mask", mask=masks.segments(torch.arange(16) // 5))
_core("alibi", "Press et al. 2022, arXiv:2108.12409", _DENSE,
      "per-head linear distance penalty", "bias", mask=masks.causal(), bias=bias_mod.alibi(3))
_core("softcap", "Gemma Team 2024, arXiv:2408.00118", _DENSE,
      "cap * tanh(scores / cap)", "bias", bias=bias_mod.softcap(5.0))
