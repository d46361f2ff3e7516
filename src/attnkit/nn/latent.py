"""Multi-head latent attention (DeepSeek-V2/V3): keys and values decompressed from a cached latent per token."""

from __future__ import annotations

import torch
from torch import nn

from .. import masks
from ..core import attention
from ..costing.attend import attend
from ..costing.spec import Spec
from ..costing.tally import dtype_of, randn
from ..errors import ArgumentError, check_int
from ..functional.quantize import dequantize
from ..registry.entry import Entry, register
from .kv_cache import LatentCache, check_step, decoding_mask
from .rotary import RotaryEmbedding, rotary_for

__all__ = ["MultiHeadLatentAttention", "LatentCache", "FORMS"]

FORMS = ("naive", "absorbed")


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention: a low-rank joint key/value latent is cached instead of keys and values.

    DeepSeek-AI 2024, "DeepSeek-V2", arXiv:2405.04434, Sec. 2.1, eqs. 9-19 (and DeepSeek-V3,
    arXiv:2412.19437, eqs. 1-11, with an RMSNorm after each down-projection)::

        c^KV_t = RMSNorm(W^DKV h_t)                  k^R_t = RoPE(W^KR h_t)         (cached: d_c + d_h^R values)
        c^Q_t = RMSNorm(W^DQ h_t)                    q_t,i = [W^UQ_i c^Q_t ; RoPE(W^QR_i c^Q_t)]
        k_t,i = [W^UK_i c^KV_t ; k^R_t]              v_t,i = W^UV_i c^KV_t
        o_t,i = sum_j softmax_j(q_t,i . k_j,i / sqrt(d_h + d_h^R)) v_j,i        u_t = W^O [o_t,1; ...; o_t,h]

    Two forms of the same function (``form=``): "naive" decompresses keys and values (eq. 17) and
    attends with ``H`` heads; "absorbed" folds ``W^UK_i`` into the query, ``q~_t,i = [W^UK_i^T q^C_t,i ;
    q^R_t,i]``, and ``W^UV_i`` into the output, attending once over the cached rows ``[c^KV_j ; k^R_j]``
    shared by every head (one key/value head: the decoding form, which reads ``d_c + d_h^R`` values
    per cached token and decompresses nothing). Both run on :func:`attnkit.attention`.

    Causal alignment (with a :class:`LatentCache`, ``t`` new queries after ``n - t`` cached)::

        t=2, n=4:  q0: x x x .    query i sees keys j <= i + n - t
                   q1: x x x x

    Notation: ``d`` = ``dim``, ``h`` = ``num_heads``, ``d_c`` = ``kv_lora_rank``, ``d_c'`` =
    ``q_lora_rank`` (None: ``q_t = W^Q h_t``, V2-Lite), ``d_h`` = ``qk_nope_head_dim``, ``d_h^R`` =
    ``qk_rope_head_dim``, value head ``v_head_dim``; ``W^DKV; W^KR`` = ``kv_down``, ``W^UK; W^UV`` =
    ``kv_up`` (per head), ``W^DQ, W^UQ; W^QR`` = ``q_down, q_up`` (or ``q_proj``), ``W^O`` = ``out_proj``.

    Differences from the paper: RMSNorms of V3 (epsilon 1e-6); ``scale`` may be changed (DeepSeek's
    YaRN multiplies it by ``mscale^2``, set by :meth:`from_transformers`); no dropout.

    Shapes: ``x`` ``(B, t, dim)``, ``key_keep_mask`` ``(B, n)`` bool (True = real token) -> ``(B, t, dim)``.

    Complexity: naive ``O(B t n h (d_h + d_h^R + d_v) + B n d_c h (d_h + d_v))``; absorbed
    ``O(B t n h (2 d_c + d_h^R) + B t h d_c (d_h + d_v))``; cache ``(d_c + d_h^R)`` values per token.

    Args:
        dim: model width.
        num_heads: ``h``.
        kv_lora_rank, q_lora_rank: ``d_c``, ``d_c'`` (None: no query compression).
        qk_nope_head_dim, qk_rope_head_dim, v_head_dim: ``d_h``, ``d_h^R``, the value head (``d_h``).
        causal: query ``i`` sees keys ``j <= i``.
        rotary: the rotation of ``d_h^R`` features (default interleaved pairs, as DeepSeek); options as
            :class:`~attnkit.nn.MultiHeadAttention`'s.
        bias: biases on the down-projections and ``W^O`` (DeepSeek's ``attention_bias``).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> mla = MultiHeadLatentAttention(24, 3, kv_lora_rank=8, q_lora_rank=12, qk_nope_head_dim=6,
        ...                                qk_rope_head_dim=4, v_head_dim=5).eval()
        >>> x = torch.randn(2, 7, 24)
        >>> full = mla(x)
        >>> cache = mla.new_cache(2, 7)
        >>> steps = [mla(x[:, :5], cache=cache)] + [mla(x[:, i:i + 1], cache=cache, form="absorbed") for i in (5, 6)]
        >>> bool(torch.allclose(torch.cat(steps, 1), full, atol=1e-5)), cache.shape[-1]  # 8 + 4 values a token
        (True, 12)
    """

    def __init__(self, dim: int, num_heads: int, *, kv_lora_rank: int, qk_rope_head_dim: int,
                 qk_nope_head_dim: int, v_head_dim: int | None = None, q_lora_rank: int | None = None,
                 causal: bool = True, rotary: bool | dict | RotaryEmbedding | None = True, bias: bool = False):
        super().__init__()
        who = "MultiHeadLatentAttention"
        for name, value in (("dim", dim), ("num_heads", num_heads), ("kv_lora_rank", kv_lora_rank),
                            ("qk_rope_head_dim", qk_rope_head_dim), ("qk_nope_head_dim", qk_nope_head_dim)):
            check_int(who, name, value, 1)
        v_head_dim = qk_nope_head_dim if v_head_dim is None else check_int(who, "v_head_dim", v_head_dim, 1)
        self.dim, self.num_heads, self.causal = dim, num_heads, bool(causal)
        self.kv_lora_rank, self.q_lora_rank = kv_lora_rank, q_lora_rank
        self.nope_dim, self.rope_dim, self.v_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.scale = (qk_nope_head_dim + qk_rope_head_dim) ** -0.5
        q_out = num_heads * (qk_nope_head_dim + qk_rope_head_dim)
        if q_lora_rank is None:
            self.q_proj = nn.Linear(dim, q_out, bias=False)
        else:
            check_int(who, "q_lora_rank", q_lora_rank, 1)
            self.q_down, self.q_norm = nn.Linear(dim, q_lora_rank, bias=bias), nn.RMSNorm(q_lora_rank, eps=1e-6)
            self.q_up = nn.Linear(q_lora_rank, q_out, bias=False)
        self.kv_down = nn.Linear(dim, kv_lora_rank + qk_rope_head_dim, bias=bias)
        self.kv_norm = nn.RMSNorm(kv_lora_rank, eps=1e-6)
        self.kv_up = nn.Linear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.out_proj = nn.Linear(num_heads * v_head_dim, dim, bias=bias)
        default = {"pairing": "interleaved"} if rotary is True else rotary
        self.rotary = rotary_for(who, default, qk_rope_head_dim)

    def new_cache(self, batch: int, max_len: int, *, dtype=None, device=None, kv_format=None) -> LatentCache:
        """An empty :class:`LatentCache` for ``forward(..., cache=)`` (the parameters' dtype and device;
        ``kv_format``: quantized rows, :class:`~attnkit.functional.quantize.KVFormat`)."""
        w = self.out_proj.weight
        return LatentCache(batch, max_len, self.kv_lora_rank, self.rope_dim, dtype=dtype or w.dtype,
                           device=device or w.device, kv_format=kv_format)

    def _query_input(self, x):
        """What the query up-projection reads: ``c^Q_t = RMSNorm(W^DQ h_t)`` (``h_t`` without query compression)."""
        return x if self.q_lora_rank is None else self.q_norm(self.q_down(x))

    def _queries(self, q_input, start: int):
        """``(q^C (B, h, t, d_h), q^R (B, h, t, d_h^R))``, the rotated part at positions ``start ..``."""
        q = self.q_proj(q_input) if self.q_lora_rank is None else self.q_up(q_input)
        q = q.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)  # (B, t, h (d_h + d_h^R)) -> (B, h, t, .)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        return q_nope, self._rotate(q_rope, start)

    def _rotate(self, t, start: int):
        return t if self.rotary is None else self.rotary.rotate(t, offset=start)

    def forward(self, x: torch.Tensor, *, key_keep_mask: torch.Tensor | None = None,
                cache: LatentCache | None = None, form: str = "naive") -> torch.Tensor:
        who = type(self).__name__
        if form not in FORMS:
            raise ArgumentError(f"{who}: form must be one of {FORMS}; got {form!r}")
        x, start = check_step(who, self, x, self.dim, key_keep_mask, cache, LatentCache)
        q_input = self._query_input(x)
        q_nope, q_rope = self._queries(q_input, start)
        latent, k_rope = self.kv_down(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        rows = torch.cat([self.kv_norm(latent)[:, None], self._rotate(k_rope[:, None], start)], dim=-1)  # (B, 1, t, .)
        scales = {}
        if cache is not None:
            rows = cache.append_rows(rows)  # a quantized cache's codes, read with its row scales
            scales = cache.scales
        mask = decoding_mask(self.causal, self._selected(x, q_input, key_keep_mask), x.shape[1], rows.shape[2],
                             key_keep_mask)
        attend = self._absorbed if form == "absorbed" else self._naive
        out = attend(q_nope, q_rope, rows, mask, scales)  # (B, h, t, d_v)
        return self.out_proj(out.transpose(1, 2).flatten(2))  # (B, h, t, d_v) -> (B, t, h d_v)

    def _selected(self, x, q_input, key_keep_mask):
        """A mask restricting each query's keys further (None: every key; DSA's top-k in a subclass)."""
        return None

    def _naive(self, q_nope, q_rope, rows, mask, scales):
        """Decompress: ``k_j,i = [W^UK_i c_j ; k^R_j]``, ``v_j,i = W^UV_i c_j``, then ``h``-head attention.

        Quantized rows are dequantized first: this form builds every head's keys and values from all rows."""
        if scales:
            rows = dequantize(rows, scales["k_scale"], q_nope.dtype)
        b, _, n, _ = rows.shape
        kv = self.kv_up(rows[:, 0, :, :self.kv_lora_rank]).unflatten(-1, (self.num_heads, -1)).transpose(1, 2)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)  # (B, h, n, d_h), (B, h, n, d_v)
        k = torch.cat([k_nope, rows[..., self.kv_lora_rank:].expand(b, self.num_heads, n, -1)], dim=-1)
        return attention(torch.cat([q_nope, q_rope], dim=-1), k, v, mask=mask, scale=self.scale)

    def _absorbed(self, q_nope, q_rope, rows, mask, scales):
        """Absorb: ``q~_i = [W^UK_i^T q^C_i ; q^R_i]`` over the shared rows ``[c_j ; k^R_j]``, then ``W^UV_i``.

        Quantized rows stay codes: attention dequantizes one key block at a time (``k_scale=``, ``v_scale=``)."""
        w_uk, w_uv = self.kv_up.weight.unflatten(0, (self.num_heads, -1)).split([self.nope_dim, self.v_dim], dim=1)
        q_latent = torch.einsum("bhtn,hnr->bhtr", q_nope, w_uk)  # (B, h, t, d_c)
        q = torch.cat([q_latent, q_rope], dim=-1)
        packed = rows.dtype == torch.uint8  # int4 codes: two features per byte
        values = rows[..., :self.kv_lora_rank // 2 if packed else self.kv_lora_rank]  # c_j (quantized: its codes)
        if q.shape[2] == 1 and (mask is None or (getattr(mask, "kind", None), getattr(mask, "align", None)) == (
                "causal", "bottom_right")):
            # One decoding step: every head's query sees every cached row, and the heads share them, so the h
            # queries are h rows of one head (MQA folded): no key or value is repeated per head.
            out = attention(q.transpose(1, 2), rows, values, scale=self.scale, **scales).transpose(1, 2)
        else:
            out = attention(q, rows, values, mask=mask, scale=self.scale, **scales)  # one key/value head
        return torch.einsum("bhtr,hvr->bhtv", out, w_uv)  # (B, h, t, d_v)

    @classmethod
    def from_transformers(cls, layer) -> MultiHeadLatentAttention:
        """The equivalent module of a transformers DeepSeek-V3 (or V2) attention layer, weights copied.

        ``module(x)`` then equals the layer on ``x`` at positions ``0 ..`` with a causal mask
        (rotary pairing, YaRN scaling and the softmax scale read from the layer's config). A layer with
        a lightning indexer (DeepSeek-V3.2, GLM-MoE-DSA), whose top-k this module would drop, raises
        ArgumentError: :meth:`attnkit.nn.DSALatentAttention.from_transformers` converts it.
        """
        from ..integrations.transformers_layers import latent_from_transformers

        return latent_from_transformers(cls, layer)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, kv_lora_rank={self.kv_lora_rank}, "
                f"q_lora_rank={self.q_lora_rank}, qk_nope_head_dim={self.nope_dim}, "
                f"qk_rope_head_dim={self.rope_dim}, v_head_dim={self.v_dim}, causal={self.causal}")


_DEEPSEEK = ("Liu et al. 2024, arXiv:2405.04434, Sec. 3.1.2 (DeepSeek-V2: d_c = 4 d_h, d_h^R = d_h / 2, "
             "d_v = d_h; queries uncompressed here, as V2-Lite)")


def _derive(s: dict) -> dict:
    nope = s["qk_nope_head_dim"]
    for name, value in (("kv_lora_rank", 4 * nope), ("qk_rope_head_dim", max(1, nope // 2)), ("v_head_dim", nope)):
        s[name] = value if s[name] is None else s[name]
    return s


def _make(s):
    return MultiHeadLatentAttention(
        s["dim"], s["heads"], kv_lora_rank=s["kv_lora_rank"], qk_rope_head_dim=s["qk_rope_head_dim"],
        qk_nope_head_dim=s["qk_nope_head_dim"], v_head_dim=s["v_head_dim"], q_lora_rank=s["q_lora_rank"],
        causal=s["causal"]).to(dtype_of(s)).eval()


def _count(t, s, module=None):
    b, n, dim, h, causal = s["batch"], s["length"], s["dim"], s["heads"], s["causal"]
    r, rq, nope, rope, dv = (s[k] for k in ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                            "v_head_dim"))
    bn, qk = b * n, nope + rope
    if rq is None:
        t.mm("query projection", 1, bn, dim, h * qk)
    else:
        t.mm("query down- and up-projections", 1, bn, dim, rq)
        t.mm("query down- and up-projections", 1, bn, rq, h * qk)
        t.ew("RMSNorm and RoPE (elementwise)", bn * rq, 4)
    t.mm("latent down-projection (c^KV, k^R)", 1, bn, dim, r + rope)
    t.ew("RMSNorm and RoPE (elementwise)", bn * (r + 3 * rope * (h + 1)), 4)
    mask = {"mask": masks.causal()} if causal else {}
    if s["form"] == "naive":
        t.mm("key/value up-projection (decompression)", 1, bn, r, h * (nope + dv))
        attend(t, "", b, h, n, n, qk, dv, dtype=dtype_of(s), scale=qk ** -0.5, **mask)
    else:
        t.mm("absorbed W^UK (query) and W^UV (output)", h, bn, nope, r)
        attend(t, "", b, h, n, n, r + rope, r, hkv=1, dtype=dtype_of(s), scale=qk ** -0.5, **mask)
        t.mm("absorbed W^UK (query) and W^UV (output)", h, bn, r, dv)
    t.mm("output projection", 1, bn, h * dv, dim)
    weights = dim * (h * qk if rq is None else rq + rq * h * qk) + dim * (r + rope) + r * h * (nope + dv)
    t.io(bn * dim, weights + h * dv * dim, bn * dim)
    t.decoding(per_token=(r + rope) * t.itemsize)  # the latent cache: c^KV and the shared k^R, every form


def _inputs(s, module):
    return (lambda x: module(x, form=s["form"])), (randn(s["batch"], s["length"], s["dim"], dtype=dtype_of(s)),)


def _config(m):
    return {"dim": m.dim, "heads": m.num_heads, "kv_lora_rank": m.kv_lora_rank, "q_lora_rank": m.q_lora_rank,
            "qk_nope_head_dim": m.nope_dim, "qk_rope_head_dim": m.rope_dim, "v_head_dim": m.v_dim,
            "causal": m.causal}


def _example():
    torch.manual_seed(0)
    module = MultiHeadLatentAttention(24, 3, kv_lora_rank=8, q_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4,
                                      v_head_dim=5).eval()
    return module, (randn(2, 16, 24),)


register(Entry(
    "multi-head-latent", MultiHeadLatentAttention, "DeepSeek-AI 2024, arXiv:2405.04434, Sec. 2.1, eqs. 9-19",
    "O(L S h (d_h + d_h^R + d_v))", "keys and values decompressed from a cached low-rank latent (d_c + d_h^R values "
    "per token); naive and absorbed (decoding) forms", family="module", example=_example,
    spec=Spec({"batch": 2, "length": 16, "dim": 24, "heads": 3, "kv_lora_rank": 8, "q_lora_rank": 12,
               "qk_nope_head_dim": 6, "qk_rope_head_dim": 4, "v_head_dim": 5, "causal": True, "form": "naive",
               "dtype": "float32"},
              _count, _inputs, "projections 2 B L d (d_c' + h (d_h + d_h^R) + d_c + d_h^R + h d_v) + naive "
              "decompression 2 B L d_c h (d_h + d_v) or absorbed 2 B L h d_c (d_h + d_v); attention with "
              "D = d_h + d_h^R, Dv = d_v (naive) or one key head D = d_c + d_h^R, Dv = d_c (absorbed)",
              make=_make, length=("length",), at_scale={"kv_lora_rank": None, "q_lora_rank": None,
                                                        "qk_rope_head_dim": None, "v_head_dim": None},
              source=_DEEPSEEK, derive=_derive, config=_config, module_type=MultiHeadLatentAttention,
              nullable=frozenset({"kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim"}),
              aliases={"head_dim": "qk_nope_head_dim"})))
