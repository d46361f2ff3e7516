"""Cost specs of the :func:`attnkit.attention` entries (scores, normalisers, masks, biases), the two
dot-product modules, and the scaling-only mechanisms "dense", "sdpa" and mask expressions.

Sizes: ``batch, heads, kv_heads (default heads), q_len, kv_len (default q_len), head_dim,
value_dim (default head_dim), dtype, backend``, plus the mask's own sizes (``window``,
``stride``, ...). FLOPs follow the kernel the dispatcher picks (see :mod:`.attention`).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ... import bias as bias_mod
from ... import masks
from ...core import attention
from ...errors import ArgumentError
from ...nn.multihead import DotProductAttention, MultiHeadAttention
from .attention import attend
from .tally import Spec, dropout_of, randn

__all__ = ["SPECS", "mask_spec", "ATTENTION_FORMULA"]

ATTENTION_FORMULA = ("attention: 2 B H Lq Lk (D + Dv) on the sdpa/reference/chunked kernels; "
                     "2 B H n_blocks bs (w bs) (D + Dv) over the active key blocks on the blocksparse kernel")
_SIZES = {"batch": 2, "heads": 3, "kv_heads": None, "q_len": 16, "kv_len": None, "head_dim": 8,
          "value_dim": None, "dtype": "float32", "backend": "auto"}
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _derive(s: dict) -> dict:
    s["kv_heads"] = s["heads"] if s["kv_heads"] is None else s["kv_heads"]
    s["kv_len"] = s["q_len"] if s["kv_len"] is None else s["kv_len"]
    s["value_dim"] = s["head_dim"] if s["value_dim"] is None else s["value_dim"]
    return s


def dtype_of(s: dict) -> torch.dtype:
    return _DTYPES[s["dtype"]]


def _qkv(s: dict):
    b, h, hkv, lq, lk = s["batch"], s["heads"], s["kv_heads"], s["q_len"], s["kv_len"]
    shapes = ((b, h, lq, s["head_dim"]), (b, hkv, lk, s["head_dim"]), (b, hkv, lk, s["value_dim"]))
    return tuple(randn(*shape, seed=i, dtype=dtype_of(s)) for i, shape in enumerate(shapes))


def _core_count(kwargs_of):
    def count(t, s, module=None):
        attend(t, "", s["batch"], s["heads"], s["q_len"], s["kv_len"], s["head_dim"], s["value_dim"],
               hkv=s["kv_heads"], dtype=dtype_of(s), backend=s["backend"], **kwargs_of(s))
    return count


def _core_inputs(kwargs_of):
    def inputs(s, module=None):
        return functools.partial(attention, backend=s["backend"], **kwargs_of(s)), _qkv(s)
    return inputs


def _core(name: str, kwargs_of, formula: str = ATTENTION_FORMULA, **extra) -> Spec:
    return Spec(name, {**_SIZES, **extra}, _core_count(kwargs_of), _core_inputs(kwargs_of), formula,
                length=("q_len", "kv_len"), derive=_derive)


def mask_spec(text: str) -> Spec:
    """A spec for ``attention(q, k, v, mask=masks.parse(text), normalize=...)`` ("sliding_window(128,128)")."""
    mask = masks.parse(text)
    return _core(text, lambda s: {"mask": mask, "normalize": s["normalize"]}, normalize="softmax")


def _segments(s):
    return masks.segments(torch.arange(s["q_len"]) // s["segment"], torch.arange(s["kv_len"]) // s["segment"])


def _sdpa_count(t, s, module=None):
    flash = s["head_dim"] == s["value_dim"]
    t.sdpa("attention (SDPA)", s["batch"], s["heads"], s["q_len"], s["kv_len"], s["head_dim"], s["value_dim"],
           flash=flash)
    width = s["head_dim"] + s["value_dim"]
    t.io(s["batch"] * (s["heads"] * s["q_len"] + s["kv_heads"] * s["kv_len"]) * width)


def _sdpa_inputs(s, module=None):
    return functools.partial(F.scaled_dot_product_attention, enable_gqa=s["heads"] != s["kv_heads"]), _qkv(s)


def _dot_module_count(t, s, module=None):
    attend(t, "", s["batch"], s["heads"], s["q_len"], s["kv_len"], s["head_dim"], s["value_dim"],
           hkv=s["kv_heads"], dtype=dtype_of(s), score="scaled_dot" if s["scaled"] else "dot",
           return_weights=s["need_weights"], dropout_p=dropout_of(module))


def _dot_module_inputs(s, module):
    return functools.partial(module, need_weights=s["need_weights"]), _qkv(s)


def _mha_count(t, s, module=None):
    b, lq, lk, e, h = s["batch"], s["q_len"], s["kv_len"], s["embed_dim"], s["heads"]
    hd = e // h
    kv = s["kv_heads"] * hd
    t.mm("projections (q, k, v)", 1, b * lq, e, e)
    t.mm("projections (q, k, v)", 2, b * lk, e, kv)
    t.inter(b * lq * e, 2 * b * lk * kv)
    attend(t, "", b, h, lq, lk, hd, hd, hkv=s["kv_heads"], dtype=dtype_of(s), return_weights=s["need_weights"],
           dropout_p=dropout_of(module))
    t.mm("output projection", 1, b * lq, e, e)
    t.io(3 * e * e, b * lq * e, 2 * b * lk * e, b * lq * e)


def _mha_make(s):
    return MultiHeadAttention(s["embed_dim"], s["heads"], batch_first=True, num_kv_heads=s["kv_heads"],
                              dtype=dtype_of(s)).eval()


def _mha_inputs(s, module):
    x = randn(s["batch"], s["q_len"], s["embed_dim"], dtype=dtype_of(s))
    kv = x if s["kv_len"] == s["q_len"] else randn(s["batch"], s["kv_len"], s["embed_dim"], seed=1, dtype=dtype_of(s))
    return functools.partial(module, need_weights=s["need_weights"]), (x, kv, kv)


def _mha_config(m):
    if not m._qkv_same_embed_dim or m._n_extra:
        raise ArgumentError("cost: multi-head with kdim/vdim, add_bias_kv or add_zero_attn has no cost formula here")
    return {"embed_dim": m.embed_dim, "heads": m.num_heads, "kv_heads": m.num_kv_heads}


def _mha_derive(s):
    s["kv_heads"] = s["heads"] if s["kv_heads"] is None else s["kv_heads"]
    s["kv_len"] = s["q_len"] if s["kv_len"] is None else s["kv_len"]
    return s


_PROJ = "projections 2 B (Lq E^2 + 2 Lk E E_kv) + output 2 B Lq E^2; "
SPECS = [
    _core("scaled-dot-product", lambda s: {}),
    _core("dense", lambda s: {}),
    _core("dot-product", lambda s: {"score": "dot"}),
    _core("cosine", lambda s: {"score": "cosine", "scale": 10.0}),
    _core("sparsemax", lambda s: {"normalize": "sparsemax"}),
    _core("sigmoid", lambda s: {"normalize": "sigmoid"}),
    _core("hard-argmax", lambda s: {"normalize": "hard"}),
    _core("gumbel-softmax", lambda s: {"normalize": "gumbel"}),
    _core("causal", lambda s: {"mask": masks.causal()}),
    _core("sliding-window", lambda s: {"mask": masks.sliding_window(s["window"], s["window"])}, window=4),
    _core("dilated-window", lambda s: {"mask": masks.dilated(s["window"], s["dilation"])}, window=2, dilation=2),
    _core("sparse-strided", lambda s: {"mask": masks.strided(s["stride"]) & masks.causal()}, stride=4),
    _core("sparse-fixed", lambda s: {"mask": masks.fixed(s["stride"], s["summary"]) & masks.causal()},
          stride=4, summary=1),
    _core("global-tokens", lambda s: {"mask": masks.global_tokens(list(range(s["globals"])))
                                      | masks.sliding_window(s["window"], s["window"])}, globals=1, window=2),
    _core("prefix-lm", lambda s: {"mask": masks.prefix_lm(s["prefix"])}, prefix=4),
    _core("segment-level", lambda s: {"mask": _segments(s)}, segment=5),
    _core("alibi", lambda s: {"mask": masks.causal(), "bias": bias_mod.alibi(s["heads"])}),
    _core("softcap", lambda s: {"bias": bias_mod.softcap(s["cap"])}, cap=5.0),
    _core("relative-position-bias", lambda s: {"bias": bias_mod.RelativePositionBias(
        s["heads"], num_buckets=s["num_buckets"], max_distance=s["max_distance"])}, num_buckets=16, max_distance=32,
          q_len=10),
    Spec("sdpa", {k: v for k, v in _SIZES.items() if k != "backend"}, _sdpa_count, _sdpa_inputs,
         "torch SDPA: 2 B H Lq Lk (D + Dv)", length=("q_len", "kv_len"), derive=_derive),
    Spec("dot-product-module", {**_SIZES, "scaled": True, "need_weights": False}, _dot_module_count,
         _dot_module_inputs, ATTENTION_FORMULA, make=lambda s: DotProductAttention(scaled=s["scaled"]).eval(),
         length=("q_len", "kv_len"), derive=_derive, config=lambda m: {"scaled": m.scaled},
         module_type=DotProductAttention),
    Spec("multi-head", {"batch": 2, "q_len": 16, "kv_len": None, "embed_dim": 24, "heads": 3, "kv_heads": None,
                        "need_weights": True, "dtype": "float32"},
         _mha_count, _mha_inputs, _PROJ + ATTENTION_FORMULA, make=_mha_make, length=("q_len", "kv_len"),
         derive=_mha_derive, module_type=MultiHeadAttention, config=_mha_config),
]
