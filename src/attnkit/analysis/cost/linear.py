"""Cost specs of the linear-time and latent modules: linear attention, Performer, Linformer, lambda
layers, Perceiver.

Sizes: ``batch, length, dim, heads`` and each module's own (``num_features``, ``k_proj_dim``,
``key_dim``, ``latents`` ...), ``dtype``.
"""

from __future__ import annotations

import math

from ...nn.lambda_layer import LambdaLayer
from ...nn.linear import LinearAttention, PerformerAttention
from ...nn.linformer import LinformerAttention
from ...nn.perceiver import PerceiverAttention, PerceiverEncoder
from .attention import attend
from .core import ATTENTION_FORMULA, dtype_of
from .sparse import projections
from .tally import Spec, dropout_of, randn

__all__ = ["SPECS"]

_SIZES = {"batch": 2, "length": 16, "dim": 32, "heads": 4, "dtype": "float32"}


def _x(s, module):
    return module, (randn(s["batch"], s["length"], s["dim"], dtype=dtype_of(s)),)


def _feature_sums(t, s, f, dv, causal, chunk):
    """:func:`attnkit.nn.linear.feature_map_attention` on features of width ``f``."""
    bh, n = s["batch"] * s["heads"], s["length"]
    if not causal:
        t.mm("phi(K)^T V", bh, f, n, dv)
        t.mm("phi(Q) (phi(K)^T V)", bh, n, f, dv)
        t.mm("normaliser phi(Q) sum phi(K)", bh, n, f, 1)
        return
    padded = -(-n // chunk) * chunk  # the chunks are padded to whole chunks
    t.mm("chunk states phi(K)^T V", bh * (padded // chunk), f, chunk, dv)
    t.mm("in-chunk scores phi(Q) phi(K)^T", bh * (padded // chunk), chunk, f, chunk)
    t.mm("phi(Q) @ state (prefix)", bh, padded, f, dv)
    t.mm("in-chunk scores @ V", bh * (padded // chunk), chunk, chunk, dv)
    t.mm("normaliser phi(Q) @ prefix sum", bh, padded, f, 1)
    t.inter(bh * padded * (chunk + f * dv // chunk))


def _linear_count(t, s, module=None):
    d = s["dim"] // s["heads"]
    projections(t, s)
    if s["length"]:
        t.ew("feature map elu(x) + 1", 2 * s["batch"] * s["length"] * s["dim"], 2)
        _feature_sums(t, s, d, d, s["causal"], s["chunk_size"])


def _performer_causal(t, s, m, d):
    """The chunk loop of :meth:`PerformerAttention._causal_scan`; the first chunk's state is a constant."""
    bh, n, c = s["batch"] * s["heads"], s["length"], s["chunk_size"]
    for i, start in enumerate(range(0, n, c)):
        ci, g = min(c, n - start), 1 if i == 0 else 2  # the first chunk reads the zero state
        t.mm("in-chunk scores phi(Q) phi(K)^T", bh, ci, m, ci)
        t.mm("phi(Q) @ state", bh, ci, m, d, grads=g)
        t.mm("in-chunk scores @ V", bh, ci, ci, d)
        t.mm("normaliser phi(Q) @ zstate", bh, ci, m, 1, grads=g)
        t.mm("state update phi(K)^T V", bh, m, ci, d, grads=2 if start + c < n else 0)  # the last is never read


def _performer_count(t, s, module=None):
    b, n, h = s["batch"], s["length"], s["heads"]
    d, m = s["dim"] // h, s["num_features"]
    projections(t, s)
    if not n:
        return
    t.mm("feature logits x W^T (W fixed)", 2, b * h * n, d, m, grads=1)
    t.ew("features exp(. - |x|^2 / 2)", 2 * b * h * n * m, 6)
    t.inter(2 * b * h * n * m)
    if s["causal"]:
        _performer_causal(t, s, m, d)
    else:
        _feature_sums(t, s, m, d, False, 1)


def _performer_derive(s):
    if s["num_features"] is None:
        d = s["dim"] // s["heads"]
        s["num_features"] = d * max(1, math.ceil(math.log(d)))
    return s


def _linformer_count(t, s, module=None):
    b, n, h, kp = s["batch"], s["length"], s["heads"], s["k_proj_dim"]
    d = s["dim"] // h
    projections(t, s)
    t.mm("sequence projections E K, F V", 2 * b * h, kp, n, d)
    t.inter(2 * b * h * kp * d)
    attend(t, "", b, h, n, kp, d, d, dtype=dtype_of(s), dropout_p=dropout_of(module))


def _lambda_count(t, s, module=None):
    b, n, h, dim, k = s["batch"], s["length"], s["heads"], s["dim"], s["key_dim"]
    dv = (s["dim_out"] or dim) // h
    if not n:
        return
    t.mm("projections (queries)", 1, b * n, dim, k * h)
    t.mm("projections (keys, values)", 1, b * n, dim, k + dv)
    t.mm("content lambda K^T V", b, k, n, dv)
    t.mm("content output q lambda_c", b * h, n, k, dv)
    t.inter(b * n * (k * h + k + dv), b * k * dv)
    if s["local_context"] is None:
        t.mm("position logits q R^T", 1, b * h * n, k, 2 * n - 1)
        t.mm("position output (q R) V", b * h, n, n, dv)
        t.inter(b * h * n * (2 * n - 1), b * h * n * n)
    else:
        t.conv("position lambdas (conv1d over positions)", b * dv, 1, k, n, s["local_context"])
        t.mm("position output q lambda_p", b * n, h, k, dv)
        t.inter(b * n * k * dv)


def _lambda_make(s):
    return LambdaLayer(s["dim"], key_dim=s["key_dim"], num_heads=s["heads"], dim_out=s["dim_out"],
                       max_len=None if s["local_context"] else s["max_len"] or s["length"],
                       local_context=s["local_context"]).to(dtype_of(s))


def _lambda_config(m):
    return {"dim": m.dim, "key_dim": m.key_dim, "heads": m.num_heads, "dim_out": m.value_dim * m.num_heads,
            "local_context": m.local_context, "max_len": m.max_len}


def _cross(t, label, b, lq, lk, q_dim, kv_dim, heads, hd, dt, module):
    """:class:`attnkit.nn.PerceiverAttention`: projections, attention, output projection."""
    inner = heads * hd
    t.mm(f"{label}projections (q, out)", 2, b * lq, q_dim, inner)
    t.mm(f"{label}projections (k, v)", 2, b * lk, kv_dim, inner)
    t.inter(2 * b * lq * inner, 2 * b * lk * inner)
    attend(t, label, b, heads, lq, lk, hd, hd, dtype=dt, dropout_p=dropout_of(module))


def _perceiver_count(t, s, module=None):
    _cross(t, "", s["batch"], s["latents"], s["length"], s["query_dim"], s["context_dim"], s["heads"],
           s["head_dim"], dtype_of(s), module)


def _encoder_count(t, s, module=None):
    b, lat, dim, dt = s["batch"], s["latents"], s["latent_dim"], dtype_of(s)
    _cross(t, "cross-attend: ", b, lat, s["length"], dim, s["input_dim"], s["cross_heads"], s["head_dim"], dt,
           module.cross_attn)
    for i in range(s["depth"] + 1):
        label = "cross-attend: " if i == 0 else "latent blocks: "
        if i:
            _cross(t, label, b, lat, lat, dim, dim, s["latent_heads"], s["head_dim"], dt, module.blocks[i - 1]["attn"])
        t.mm(f"{label}MLP (D -> 4D -> D)", 2, b * lat, dim, 4 * dim)
        t.ew(f"{label}layer norms, GELU, residuals", b * lat * dim, 16)


def _encoder_config(m):
    cross, blocks = m.cross_attn, m.blocks
    return {"input_dim": m.input_dim, "latents": m.latents.shape[0], "latent_dim": m.latents.shape[1],
            "depth": len(blocks), "cross_heads": cross.num_heads,
            "head_dim": cross.q_proj.out_features // cross.num_heads,
            "latent_heads": blocks[0]["attn"].num_heads if len(blocks) else 1}


_FEATURES = "phi(K)^T V 2 B H n f Dv, phi(Q) state 2 B H n f Dv, normaliser 2 B H n f"
_CAUSAL = " (causal: per chunk of c, plus in-chunk scores 2 B H n c (f + Dv))"
SPECS = [
    Spec("linear-attention", {**_SIZES, "causal": True, "chunk_size": 64}, _linear_count, _x,
         "projections 8 B n dim^2; " + _FEATURES + _CAUSAL + ", n padded to whole chunks",
         make=lambda s: LinearAttention(s["dim"], s["heads"], causal=s["causal"],
                                        chunk_size=s["chunk_size"]).to(dtype_of(s)),
         module_type=LinearAttention,
         config=lambda m: {"dim": m.dim, "heads": m.num_heads, "causal": m.causal, "chunk_size": m.chunk_size}),
    Spec("performer", {**_SIZES, "num_features": 32, "causal": False, "chunk_size": 128}, _performer_count, _x,
         "projections 8 B n dim^2; features 2 x 2 B H n d m; " + _FEATURES + _CAUSAL,
         make=lambda s: PerformerAttention(s["dim"], s["heads"], num_features=s["num_features"], causal=s["causal"],
                                           chunk_size=s["chunk_size"]).to(dtype_of(s)),
         derive=_performer_derive, module_type=PerformerAttention, nullable=frozenset({"num_features"}),
         config=lambda m: {"dim": m.dim, "heads": m.num_heads, "num_features": m.num_features, "causal": m.causal,
                           "chunk_size": m.chunk_size}),
    Spec("linformer", {**_SIZES, "k_proj_dim": 8, "max_len": None, "sharing": "headwise"}, _linformer_count, _x,
         "projections 8 B n dim^2; E K and F V 2 x 2 B H k n d; " + ATTENTION_FORMULA + " with Lk = k",
         make=lambda s: LinformerAttention(s["dim"], s["heads"], max_len=s["max_len"] or s["length"],
                                           k_proj_dim=s["k_proj_dim"], sharing=s["sharing"]).to(dtype_of(s)),
         module_type=LinformerAttention,
         config=lambda m: {"dim": m.dim, "heads": m.num_heads, "max_len": m.max_len,
                           "k_proj_dim": m.proj_k.k_proj_dim}),
    *(Spec(name, {**_SIZES, "key_dim": 8, "dim_out": None, "max_len": None, "local_context": local},
           _lambda_count, _x, "projections 2 B n dim (k h + k + v); content 2 B k n v + 2 B h n k v; " + (
               "positions 2 B h n k (2n - 1) + 2 B h n^2 v" if local is None else
               "positions conv 2 B v k n r + 2 B h n k v"),
           make=_lambda_make, module_type=LambdaLayer, config=_lambda_config,
           matches=lambda m, local=local: (m.local_context is None) == (local is None))
      for name, local in (("lambda-layer", None), ("lambda-layer-local", 5))),
    Spec("perceiver-attention", {"batch": 2, "latents": 4, "length": 32, "query_dim": 16, "context_dim": 8,
                                 "heads": 2, "head_dim": 8, "dtype": "float32"},
         _perceiver_count,
         lambda s, m: (m, (randn(s["batch"], s["latents"], s["query_dim"], dtype=dtype_of(s)),
                           randn(s["batch"], s["length"], s["context_dim"], seed=1, dtype=dtype_of(s)))),
         "projections 2 B (2 N Dq + 2 L Dc) H d; " + ATTENTION_FORMULA + " with Lq = N latents",
         make=lambda s: PerceiverAttention(s["query_dim"], s["context_dim"], num_heads=s["heads"],
                                           head_dim=s["head_dim"]).to(dtype_of(s)),
         module_type=PerceiverAttention,
         config=lambda m: {"query_dim": m.query_dim, "context_dim": m.context_dim, "heads": m.num_heads,
                           "head_dim": m.q_proj.out_features // m.num_heads}),
    Spec("perceiver-encoder", {"batch": 2, "length": 32, "input_dim": 8, "latents": 4, "latent_dim": 16, "depth": 1,
                               "cross_heads": 1, "latent_heads": 2, "head_dim": 8, "dtype": "float32"},
         _encoder_count, lambda s, m: (m, (randn(s["batch"], s["length"], s["input_dim"], dtype=dtype_of(s)),)),
         "cross-attend (as perceiver-attention) + MLP 16 B N D^2; depth x (latent self-attention + MLP)",
         make=lambda s: PerceiverEncoder(s["input_dim"], num_latents=s["latents"], latent_dim=s["latent_dim"],
                                         depth=s["depth"], cross_heads=s["cross_heads"],
                                         latent_heads=s["latent_heads"], head_dim=s["head_dim"]).to(dtype_of(s)),
         module_type=PerceiverEncoder, config=_encoder_config),
]
