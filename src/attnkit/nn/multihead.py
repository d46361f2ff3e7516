"""Dot-product and multi-head attention (Vaswani et al. 2017) as modules; see also kv_cache and torch_compat."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from ..core import attention
from ..costing.attend import ATTENTION_FORMULA, ATTENTION_SIZES, attend, attention_inputs, derive_lengths, kv_cache
from ..costing.spec import Spec
from ..costing.tally import dropout_of, dtype_of, randn
from ..errors import ArgumentError, DTypeError, ShapeError
from ..integrations import torch_compat, torch_layers
from ..masks.base import Mask
from ..registry.entry import Entry, register
from . import _xoptions
from ._inputs import check_shape
from .gated import OutputGate, QKNorm
from .kv_cache import CAUSAL, KVCache
from .padding import clear_key_padding
from .rotary import RotaryEmbedding, rotary_for

__all__ = ["DotProductAttention", "MultiHeadAttention", "KVCache"]

_PAPER = "Vaswani et al. 2017, arXiv:1706.03762"


def _check_dropout(who: str, p) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
        raise ArgumentError(f"{who}: dropout must be a float in [0, 1); got {p!r}")
    return float(p)


class DotProductAttention(nn.Module):
    """Parameter-free (scaled) dot-product attention over given queries, keys and values.

    Vaswani et al. 2017, arXiv:1706.03762, eq. 1: ``Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V``;
    with ``scaled=False`` the Luong et al. 2015 "dot" score ``softmax(Q K^T) V``.

    Notation: ``Q, K, V`` = ``q, k, v``; ``d_k`` = the last dim of ``q``.

    Differences from the paper: none. Masks follow attnkit (True = attend); a query with
    no allowed key outputs 0. Returned weights are per head, before dropout.

    Shapes:
        q ``(B, H, Lq, D)`` or ``(B, Lq, D)``; k ``(B, Hkv, Lk, D)`` (``H % Hkv == 0``) or
        ``(B, Lk, D)``; v likewise with ``Dv`` -> out ``(..., Lq, Dv)``, weights ``(..., Lq, Lk)``.

    Complexity:
        ``O(B H Lq Lk (D + Dv))`` time; memory as the backend :func:`attnkit.attention` picks.

    Args:
        scaled: divide the scores by ``sqrt(D)`` (default) or not.
        dropout: dropout on the weights, applied only in training.

    Example:
        >>> import torch
        >>> from attnkit import masks
        >>> from attnkit.nn.multihead import DotProductAttention
        >>> g = torch.Generator().manual_seed(0)
        >>> q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
        >>> out, w = DotProductAttention()(q, k, v, mask=masks.causal(), need_weights=True)
        >>> tuple(out.shape), w[0, 0, 0].tolist()  # the first query sees only the first key
        ((2, 3, 5, 4), [1.0, 0.0, 0.0, 0.0, 0.0])
    """

    def __init__(self, *, scaled: bool = True, dropout: float = 0.0):
        super().__init__()
        self.scaled = bool(scaled)
        self.dropout = _check_dropout("DotProductAttention", dropout)

    def forward(self, q, k, v, *, mask=None, need_weights: bool = False):
        """``out``, or ``(out, weights)`` when ``need_weights``; ``mask`` as in :func:`attnkit.attention`."""
        for name, t in (("q", q), ("k", k), ("v", v)):
            if isinstance(t, torch.Tensor):  # anything else: attention() names it
                check_shape("DotProductAttention", name, t, lambda t: t.dim() in (3, 4),
                            "be 3-D (B, L, D) or 4-D (B, H, L, D)")
        res = attention(q, k, v, mask=mask, score="scaled_dot" if self.scaled else "dot",
                        dropout_p=self.dropout if self.training else 0.0, return_weights=need_weights)
        return (res.output, res.weights) if need_weights else res

    def extra_repr(self) -> str:
        return f"scaled={self.scaled}, dropout={self.dropout}"


class MultiHeadAttention(nn.Module):
    """Multi-head attention: a drop-in for ``torch.nn.MultiheadAttention``, plus grouped-query heads and a KV cache.

    Vaswani et al. 2017, "Attention Is All You Need", arXiv:1706.03762, Sec. 3.2.2::

        MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,   head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)
        Attention(q, k, v) = softmax(q k^T / sqrt(d_k)) v                                   (eq. 1)

    Notation: ``d_model`` = ``embed_dim``, ``h`` = ``num_heads``, ``d_k = d_v`` = ``embed_dim // num_heads``;
    ``W^Q, W^K, W^V`` are stacked in ``in_proj_weight`` (``q/k/v_proj_weight`` when kdim/vdim differ),
    ``W^O`` = ``out_proj.weight``; state_dict keys are torch's. With ``num_kv_heads = g`` query head ``i``
    uses key/value head ``i // (h / g)`` (grouped-query attention, Ainslie et al. 2023, arXiv:2305.13245).

    Masks, all combined with logical AND (torch's arguments keep torch's polarity and are converted here):
    ``key_padding_mask`` ``(N, S)`` bool True = padding, ignored; ``attn_mask`` ``(L, S)`` or
    ``(N * num_heads, L, S)`` bool True = *not* allowed; a float one of either is added to the scores.
    ``is_causal=True`` applies a causal mask (query ``i`` sees keys ``j <= i``; needs ``L == S``, except
    beside an ``attn_mask``, which torch's hint says is the causal mask: then ``attn_mask`` alone applies).
    ``mask=`` takes an :mod:`attnkit.masks` mask or bool tensor, True = attend. Keys appended by
    ``add_bias_kv`` / ``add_zero_attn`` are always allowed. :meth:`forward_step` decodes against a
    :class:`KVCache` with bottom-right causal alignment (``t`` new queries after ``n - t`` cached keys)::

        t=2, n=4:  q0: x x x .    query i sees keys j <= i + n - t
                   q1: x x x x

    Differences from the paper: torch's extensions (biases, kdim/vdim, bias_k/bias_v, zero attention).
    Differences from torch: a query with no allowed key gets 0 before ``out_proj`` where torch gives
    NaN; ``is_causal`` is applied, not a hint that needs ``attn_mask``; weights are returned before
    dropout (torch: after; the same in eval). In torch's ``TransformerEncoderLayer`` the module is always
    called (the layer's fused kernel is declined, :mod:`.torch_layers`); nested inputs from
    ``TransformerEncoder`` are padded and the output nested again.

    Shapes:
        query ``(L, N, E)`` (``(N, L, E)`` if batch_first, ``(L, E)`` unbatched); key ``(S, N, kdim)``,
        value ``(S, N, vdim)`` alike -> output like query; weights ``(N, L, S')`` averaged over heads or
        ``(N, num_heads, L, S')`` (no N unbatched), ``S' = S + add_bias_kv + add_zero_attn``.

    Complexity:
        ``O(N (L + S) E^2)`` for the projections plus ``O(N L S E)`` for attention; ``O(N H L S)``
        memory with ``need_weights=True`` (torch's default), else as :func:`attnkit.attention` picks.

    Args:
        embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn: as ``torch.nn.MultiheadAttention``
            (``embed_dim % num_heads == 0``).
        kdim, vdim, batch_first, device, dtype: as ``torch.nn.MultiheadAttention``.
        num_kv_heads: key/value heads for grouped-query attention (dividing ``num_heads``; default
            ``num_heads``). Projections for K and V then output ``num_kv_heads * head_dim`` features.
        mask: an :mod:`attnkit.masks` mask AND-ed into every call (``forward`` and ``forward_step``),
            e.g. a sliding window inside a model built from torch's layers; kept as ``extra_mask``.
        gate: a sigmoid output gate from the query's input, :class:`~attnkit.nn.gated.OutputGate`
            (Qwen3-Next's gated attention), kept as ``gate``.
        qk_norm: RMS-normalise each head's queries and keys, :class:`~attnkit.nn.gated.QKNorm`.
        rotary: rotary positions on queries and keys after QK-norm (``True``, a dict of
            :class:`~attnkit.nn.rotary.RotaryEmbedding` options such as ``{"pairing": "half",
            "fraction": 0.25}`` for partial RoPE, or a ``RotaryEmbedding(head_dim)``); queries and keys
            at positions ``0 ..`` in ``forward``, after the cached ones in ``forward_step``.
        sinks: learn one attention-sink logit per head (gpt-oss, arXiv:2508.10925), ``sinks`` of shape
            ``(num_heads,)`` initialised to 0: a term in every row's softmax denominator that takes no
            value (:func:`attnkit.attention`'s ``sinks=``). Not in ``torch.nn.MultiheadAttention``.
        head_dim: features per head, ``d_k = d_v`` (default ``embed_dim // num_heads``). Another value
            gives the layout of Qwen3 and Gemma checkpoints, whose heads do not fill the model width
            (Qwen3-0.6B: 16 heads of 128 over a 1024-wide model): ``W^Q`` is ``(num_heads * head_dim,
            embed_dim)`` and ``W^O`` ``(embed_dim, num_heads * head_dim)``; ``embed_dim`` then need not
            divide by ``num_heads``.
        out_bias: a bias in ``out_proj`` (default ``bias``; Qwen2 has biases in ``W^Q, W^K, W^V`` only).
        scale: the factor of the scores in place of ``1 / sqrt(head_dim)`` (Gemma 2 and 3 scale by
            ``query_pre_attn_scalar ** -0.5``).
        talking_heads, num_memory_kv, value_residual, selective, cope, topk, scores, laser: the
            x-transformers options, each running its one function in :mod:`attnkit.functional` (the
            formula and its paper there; the list in :mod:`attnkit.nn._xoptions`).
            ``talking_heads="pre" | "post" | "both"``: learned ``(H, H)`` mixes of the heads' logits
            before the softmax (``pre_talking_heads``) and of their weights after it
            (``post_talking_heads``), initialised to the identity. ``num_memory_kv=M``: ``M`` learned
            key/value pairs per key head (``memory_k``, ``memory_v`` ``(Hkv, M, head_dim)``) before
            the sequence's keys, visible to every query; returned weights have ``M`` more columns,
            first. ``value_residual=True | "learned"``: ``forward(..., value_residual=v1)`` attends
            over ``mix V + (1 - mix) v1`` (ResFormer), ``v1`` the first layer's values from its
            ``forward(..., return_values=True)``; ``mix`` is 0.5, or ``sigmoid(value W + b)`` per
            token and key head (``value_residual_mix``, a Linear) for ``"learned"``.
            ``selective=True``: head 0's logits mask, softly, what later queries see. ``cope=P``:
            contextual positions, ``P`` embeddings ``cope_positions`` ``(P, head_dim)`` initialised
            to 0. ``topk=k``: each query keeps its ``k`` best allowed keys. ``scores="l2"``:
            ``-|q - k|^2`` scores. ``laser=True``: ``log(softmax(.) exp(V))``.
            One of them at a time beside ``value_residual`` (each makes its own attention call).
            Refused, with the reason: ``need_weights=True`` with talking heads or LASER (no one map);
            selective and CoPE beside any mask but ``is_causal=True`` or in :meth:`forward_step` (no
            incremental form); top-k with a float ``attn_mask``; any of them over a quantized cache.

    Example:
        >>> import torch
        >>> from attnkit.nn.multihead import MultiHeadAttention
        >>> _ = torch.manual_seed(0)
        >>> mha = MultiHeadAttention(12, 3, batch_first=True).eval()
        >>> x = torch.randn(2, 5, 12)
        >>> out, w = mha(x, x, x, is_causal=True)
        >>> tuple(out.shape), tuple(w.shape)
        ((2, 5, 12), (2, 5, 5))
        >>> torch.allclose(mha.to_torch()(x, x, x, attn_mask=torch.ones(5, 5).triu(1).bool())[0], out, atol=1e-6)
        True
        >>> cache = mha.new_cache(2, 5)
        >>> steps = [mha.forward_step(x[:, :3], cache)[0]] + [mha.forward_step(x[:, i:i + 1], cache)[0] for i in (3, 4)]
        >>> torch.allclose(torch.cat(steps, 1), out, atol=1e-6)
        True
    """

    # Whether torch's TransformerEncoderLayer may hold the module as its self_attn (then it gets the pre-hook that
    # keeps the layer from its fused kernel); a subclass whose forward takes other arguments sets it False.
    _torch_layer_attention = True

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device=None, dtype=None, *,
                 num_kv_heads: int | None = None, mask: Mask | None = None, gate: bool = False,
                 qk_norm: bool = False, rotary: bool | dict | RotaryEmbedding | None = None,
                 sinks: bool = False, head_dim: int | None = None, out_bias: bool | None = None,
                 scale: float | None = None, talking_heads: str | None = None, num_memory_kv: int = 0,
                 value_residual: bool | str = False, selective: bool = False, cope: int | None = None,
                 topk: int | None = None, scores: str = "dot", laser: bool = False):
        super().__init__()
        who = "MultiHeadAttention"
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        kdim, vdim = (embed_dim if d is None else d for d in (kdim, vdim))
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads), ("num_kv_heads", num_kv_heads),
                            ("kdim", kdim), ("vdim", vdim), ("head_dim", 1 if head_dim is None else head_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArgumentError(f"{who}: {name} must be a positive int; got {value!r}")
        if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                                  or not 0 < scale < float("inf")):
            raise ArgumentError(f"{who}: scale must be None or a finite number > 0; got {scale!r}")
        if head_dim is None and embed_dim % num_heads:
            raise ArgumentError(f"{who}: embed_dim must be divisible by num_heads; got embed_dim={embed_dim}, "
                                f"num_heads={num_heads}")
        if num_heads % num_kv_heads:
            raise ArgumentError(f"{who}: num_kv_heads must divide num_heads; got num_heads={num_heads}, "
                                f"num_kv_heads={num_kv_heads}")
        self.embed_dim, self.num_heads, self.num_kv_heads = embed_dim, num_heads, num_kv_heads
        self.kdim, self.vdim = kdim, vdim
        self.head_dim = embed_dim // num_heads if head_dim is None else head_dim
        self.inner_dim = num_heads * self.head_dim  # the heads concatenated: W^Q's rows, W^O's columns
        self.scale = None if scale is None else float(scale)
        self.dropout = _check_dropout(who, dropout)
        self.batch_first, self.add_zero_attn = bool(batch_first), bool(add_zero_attn)
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        if mask is not None and not isinstance(mask, Mask):
            hint = " (a mask expression is built with attnkit.masks.parse(text))" if isinstance(mask, str) else ""
            raise DTypeError(f"{who}: mask must be an attnkit.masks.Mask or None; got {type(mask).__name__}{hint}")
        self.extra_mask = mask
        self._build(bias, bias if out_bias is None else bool(out_bias), add_bias_kv, {"device": device, "dtype": dtype})
        self.sinks = nn.Parameter(torch.zeros(num_heads, device=device, dtype=dtype)) if sinks else None
        self._reset_parameters()
        fk = {"device": device, "dtype": dtype}
        self.gate = OutputGate(embed_dim, self.inner_dim, bias=bias, **fk) if gate else None
        self.qk_norm = QKNorm(self.head_dim, **fk) if qk_norm else None
        self.rotary = rotary_for(who, rotary, self.head_dim)
        _xoptions.configure(self, who, talking_heads=talking_heads, num_memory_kv=num_memory_kv,
                            value_residual=value_residual, selective=selective, cope=cope, topk=topk, scores=scores,
                            laser=laser, **fk)
        if self._torch_layer_attention:
            torch_layers.decline_fused_layer(self)  # torch's encoder layer calls this module, never its own kernel

    def _build(self, bias, out_bias, add_bias_kv, fk):
        e, inner, kv = self.embed_dim, self.inner_dim, self.num_kv_heads * self.head_dim
        empty = lambda *shape: nn.Parameter(torch.empty(*shape, **fk))
        if self._qkv_same_embed_dim:
            self.in_proj_weight = empty(inner + 2 * kv, e)
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        else:
            self.q_proj_weight, self.k_proj_weight, self.v_proj_weight = empty(inner, e), empty(kv, self.kdim), empty(
                kv, self.vdim)
            self.register_parameter("in_proj_weight", None)
        self.in_proj_bias = empty(inner + 2 * kv) if bias else None
        self.out_proj = nn.Linear(inner, e, bias=out_bias, **fk)
        self.bias_k, self.bias_v = (empty(1, 1, kv), empty(1, 1, kv)) if add_bias_kv else (None, None)

    def _reset_parameters(self):
        # torch's initialisation, so that seeded models start from the same weights.
        for w in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
            if w is not None:
                nn.init.xavier_uniform_(w)
        for b in (self.in_proj_bias, self.out_proj.bias):
            if b is not None:
                nn.init.zeros_(b)
        for b in (self.bias_k, self.bias_v):
            if b is not None:
                nn.init.xavier_normal_(b)

    def __setstate__(self, state):
        """Unpickling a module saved before the extra mask and the hook existed gives it both."""
        super().__setstate__(state)
        self.__dict__.setdefault("extra_mask", None)
        self.__dict__.setdefault("scale", None)
        self.__dict__.setdefault("inner_dim", self.num_heads * self.head_dim)
        for name in ("gate", "qk_norm", "rotary"):
            self._modules.setdefault(name, None)
        self._parameters.setdefault("sinks", None)
        _xoptions.set_defaults(self)
        if self._torch_layer_attention:
            torch_layers.decline_fused_layer(self)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, *args):
        torch_compat.merge_projection_keys(self, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, *args)

    @property
    def _n_extra(self) -> int:
        return int(self.bias_k is not None) + int(self.add_zero_attn)

    def _heads(self, t, heads):
        # reshape, not unflatten: the same view without a Python-level wrapper, once per projection and call
        return t.reshape(*t.shape[:-1], heads, self.head_dim).transpose(1, 2)  # (B, L, h*d) -> (B, h, L, d)

    def _project(self, query, key, value):
        e, kv = self.inner_dim, self.num_kv_heads * self.head_dim
        if self._qkv_same_embed_dim and query is key and key is value:  # self-attention: one matmul for all three
            # (B, L, (H + 2 Hkv) d) -> (B, H + 2 Hkv, L, d), split into heads: three views, as _heads gives, in 3 ops
            h, hkv = self.num_heads, self.num_kv_heads
            qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)
            heads = qkv.view(*qkv.shape[:-1], h + 2 * hkv, self.head_dim).transpose(1, 2)
            return heads.split_with_sizes([h, hkv, hkv], dim=1)  # (the method itself: no Python wrapper per call)
        if self._qkv_same_embed_dim:
            wq, wk, wv = self.in_proj_weight.split([e, kv, kv])
        else:
            wq, wk, wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        bq = bk = bv = None
        if self.in_proj_bias is not None:
            bq, bk, bv = self.in_proj_bias.split([e, kv, kv])
        return (self._heads(F.linear(query, wq, bq), self.num_heads),
                self._heads(F.linear(key, wk, bk), self.num_kv_heads),
                self._heads(F.linear(value, wv, bv), self.num_kv_heads))

    def _position(self, q, k, q_offset: int = 0, k_offset: int = 0):
        """QK-norm, then rotary positions (query row ``i`` at ``q_offset + i``, key row ``j`` at ``k_offset + j``)."""
        if self.qk_norm is not None:
            q, k = self.qk_norm(q, k)
        if self.rotary is not None:
            q, k = self.rotary(q, k, q_offset=q_offset, k_offset=k_offset)
        return q, k

    def _extra_keys(self, k, v):
        """Append bias_k / bias_v and the zero key/value after the real ones: (B, Hkv, S, d) -> (B, Hkv, S', d)."""
        b = k.shape[0]
        if self.bias_k is not None:
            k = torch.cat([k, self._heads(self.bias_k, self.num_kv_heads).expand(b, -1, -1, -1)], dim=2)
            v = torch.cat([v, self._heads(self.bias_v, self.num_kv_heads).expand(b, -1, -1, -1)], dim=2)
        if self.add_zero_attn:
            k, v = (torch.cat([t, t.new_zeros(b, t.shape[1], 1, t.shape[3])], dim=2) for t in (k, v))
        return k, v

    def _attend(self, q, k, v, mask, bias, need_weights, average, batched, gate_input=None, scales=None):
        """``scales``: a quantized cache's ``k_scale``/``v_scale`` (:attr:`KVCache.scales`) when k and v are codes."""
        n_extra = self._n_extra
        if scales and n_extra:
            raise ArgumentError(f"{type(self).__name__}: a quantized KV cache cannot take the extra keys of "
                                "add_bias_kv / add_zero_attn; use a full-precision cache (kv_format=None)")
        if self.extra_mask is not None:
            mask = self.extra_mask if mask is None else mask & self.extra_mask
        if n_extra:
            k, v = self._extra_keys(k, v)
        if mask is not None or bias is not None:
            mask, bias = torch_compat.with_extra_keys(mask, bias, n_extra)
        dropout = self.dropout if self.training else 0.0
        if self.attention_option is None:
            res = attention(q, k, v, mask=mask, bias=bias, dropout_p=dropout, return_weights=need_weights,
                            sinks=self.sinks, scale=self.scale, **(scales or {}))
        else:
            options = {"dropout_p": dropout, "return_weights": need_weights, "sinks": self.sinks, "scale": self.scale}
            res = _xoptions.attend(self, q, k, v, mask=mask, bias=bias, options=options)
        out = res.output if need_weights else res
        out = out.transpose(1, 2).flatten(2)  # (B, H, L, d) -> (B, L, H d)
        out = self.out_proj(out if self.gate is None else self.gate(out, gate_input))
        weights = (res.weights.mean(1) if average else res.weights) if need_weights else None
        if not batched:
            return out[0], None if weights is None else weights[0]
        return (out if self.batch_first else out.transpose(0, 1)), weights

    def _to_batch_first(self, t, batched):
        return t if batched and self.batch_first else t.transpose(0, 1) if batched else t[None]

    def forward(self, query, key, value, key_padding_mask=None, need_weights: bool = True, attn_mask=None,
                average_attn_weights: bool = True, is_causal: bool = False, *, mask=None, value_residual=None,
                return_values: bool = False):
        """``(output, weights or None)``, as ``torch.nn.MultiheadAttention.forward`` (see the class docstring).

        ``value_residual``: the first layer's values (from its ``return_values=True``), mixed into this
        layer's when it was built with ``value_residual=True`` or ``"learned"`` (None: no mixing, as in the
        first layer). ``return_values=True`` returns ``(output, weights, values)``, ``values`` this layer's
        own (before any mixing) ``(N, num_kv_heads, S, head_dim)`` (no N unbatched).
        """
        who = type(self).__name__
        nested = None
        if torch_layers.is_nested(query, key, value):  # from torch's TransformerEncoder: padded here, nested after
            nested = torch_layers.unnest(who, self, query, key, value, key_padding_mask=key_padding_mask,
                                         attn_mask=attn_mask, need_weights=need_weights)
            query, key, value, key_padding_mask = nested[:4]
        batched = torch_compat.check_inputs(who, self, query, key, value)
        self_attention = query is key
        query, key, value = (self._to_batch_first(t, batched) for t in (query, key, value))
        full = (query.shape[0], self.num_heads, query.shape[1], key.shape[1])
        mask, bias = torch_compat.convert_masks(who, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                                                is_causal=is_causal, mask=mask, full=full, batched=batched,
                                                device=query.device)
        query, key, value = clear_key_padding(query, key, value, key_padding_mask, self_attention=self_attention)
        _xoptions.check_call(self, who, need_weights=need_weights, mask=mask, bias=bias, n_extra=self._n_extra)
        q, k, v = self._project(query, key, value)
        if self.qk_norm is not None or self.rotary is not None:
            q, k = self._position(q, k)
        own = v
        if value_residual is not None:
            v = _xoptions.mix_values(self, who, v, value, value_residual, batched)
        out, weights = self._attend(q, k, v, mask, bias, need_weights, average_attn_weights, batched, query)
        if nested is not None:
            out, weights = torch_layers.renest(out, nested), None
        if return_values:
            return out, weights, own if batched else own[0]
        return out, weights

    def new_cache(self, batch: int, max_len: int, *, dtype=None, device=None, kv_format=None) -> KVCache:
        """An empty :class:`KVCache` for :meth:`forward_step` (the parameters' dtype and device by default;
        ``kv_format``: quantized storage, :class:`~attnkit.functional.quantize.KVFormat`)."""
        w = self.out_proj.weight
        return KVCache(batch, max_len, self.num_kv_heads, self.head_dim, dtype=dtype or w.dtype,
                       device=device or w.device, kv_format=kv_format)

    def forward_step(self, x, cache: KVCache, *, need_weights: bool = False, average_attn_weights: bool = True,
                     value_residual=None, return_values: bool = False):
        """Causal self-attention of ``t`` new positions ``x`` (layout as ``query``) over ``cache`` + themselves.

        Appends the new keys/values to ``cache`` and returns ``(output, weights or None)`` like
        :meth:`forward` with ``is_causal=True`` on the whole sequence so far (bottom-right alignment).
        ``value_residual`` / ``return_values``: as :meth:`forward`, for the ``t`` new positions (the
        cache stores the mixed values).
        """
        who = f"{type(self).__name__}.forward_step"
        if not self._qkv_same_embed_dim:
            raise ArgumentError(f"{who}: self-attention needs kdim == vdim == embed_dim; got kdim={self.kdim}, "
                                f"vdim={self.vdim}, embed_dim={self.embed_dim}")
        if not isinstance(cache, KVCache):
            raise DTypeError(f"{who}: cache must be a KVCache (see new_cache); got {type(cache).__name__}")
        batched = torch_compat.check_inputs(who, self, x, x, x)
        x = self._to_batch_first(x, batched)
        want = (x.shape[0], self.num_kv_heads, cache.capacity, self.head_dim)
        if cache.shape != want:
            raise ShapeError(f"{who}: cache must have shape (batch, num_kv_heads, capacity, head_dim) = {want}; "
                             f"got {cache.shape}")
        _xoptions.check_call(self, who, need_weights=need_weights, decoding=True, quantized=bool(cache.scales))
        q, k, v = self._project(x, x, x)
        q, k = self._position(q, k, len(cache), len(cache))
        own = v
        if value_residual is not None:
            v = _xoptions.mix_values(self, who, v, x, value_residual, batched)
        k, v = cache.append(k, v)
        out, weights = self._attend(q, k, v, CAUSAL, None, need_weights, average_attn_weights, batched, x,
                                    cache.scales)
        return (out, weights, own if batched else own[0]) if return_values else (out, weights)

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention, *, mask: Mask | None = None) -> MultiHeadAttention:
        """The equivalent module, with ``module``'s configuration, weights and training mode (and ``mask``)."""
        return torch_compat.from_torch(cls, module, mask=mask)

    def to_torch(self) -> nn.MultiheadAttention:
        """The equivalent ``torch.nn.MultiheadAttention`` (raises for grouped-query heads, an extra mask, sinks)."""
        if self.sinks is not None:
            raise ArgumentError("MultiHeadAttention.to_torch: torch.nn.MultiheadAttention has no attention sinks")
        if _xoptions.any_on(self):
            raise ArgumentError("MultiHeadAttention.to_torch: torch.nn.MultiheadAttention has none of the "
                                f"x-transformers options (this module has{_xoptions.describe(self)[1:]})")
        return torch_compat.to_torch(self)

    @classmethod
    def from_transformers(cls, layer) -> MultiHeadAttention:
        """The equivalent module of a transformers decoder attention layer (Llama, Mistral, Qwen2, Qwen3,
        Qwen3-Next's gated one, Gemma, Gemma 3).

        Its weights and biases, head width (heads that do not fill ``hidden_size`` included), softmax
        scale, QK-norm, output gate, sliding window (as the extra ``mask``) and rotary positions (pairing,
        partial rotation and scaling from the layer's config) are copied; ``module(x, x, x,
        is_causal=True)`` then equals the layer on ``x`` at positions ``0 ..`` with its model's mask, and
        :meth:`forward_step` the layer decoding with a cache. A layer that caps its scores with tanh
        (Gemma 2) or lacks separate ``q/k/v/o_proj`` layers raises ArgumentError.
        """
        from ..integrations.transformers_layers import multihead_from_transformers

        return multihead_from_transformers(cls, layer)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"kdim={self.kdim}, vdim={self.vdim}, batch_first={self.batch_first}"
                + ("" if self.extra_mask is None else f", mask={self.extra_mask!r}")
                + ("" if self.sinks is None else ", sinks=True")
                + ("" if self.inner_dim == self.embed_dim else f", head_dim={self.head_dim}")
                + ("" if self.scale is None else f", scale={self.scale}") + _xoptions.describe(self))


def _mha_example(gate: bool = False, qk_norm: bool = False, rotary=None):
    def example():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(2, 16, 24, generator=g)
        torch.manual_seed(0)
        module = MultiHeadAttention(24, 3, batch_first=True, gate=gate, qk_norm=qk_norm, rotary=rotary)
        return module.eval(), (x, x, x)
    return example


def _dot_example():
    g = torch.Generator().manual_seed(0)
    return DotProductAttention(), tuple(torch.randn(2, 3, 16, 8, generator=g) for _ in range(3))


def _dot_count(t, s, module=None):
    attend(t, "", s["batch"], s["heads"], s["q_len"], s["kv_len"], s["head_dim"], s["value_dim"],
           hkv=s["kv_heads"], dtype=dtype_of(s), score="scaled_dot" if s["scaled"] else "dot",
           return_weights=s["need_weights"], dropout_p=dropout_of(module))


def _mha_count(t, s, module=None):
    b, lq, lk, e, h = s["batch"], s["q_len"], s["kv_len"], s["embed_dim"], s["heads"]
    hd = e // h
    kv = s["kv_heads"] * hd
    t.mm("projections (q, k, v)", 1, b * lq, e, e)
    t.mm("projections (q, k, v)", 2, b * lk, e, kv)
    t.inter(b * lq * e, 2 * b * lk * kv)
    if s["qk_norm"]:
        t.ew("QK-norm (elementwise; no matmul)", b * (lq * e + lk * kv), 4)
    attend(t, "", b, h, lq, lk, hd, hd, hkv=s["kv_heads"], dtype=dtype_of(s), return_weights=s["need_weights"],
           dropout_p=dropout_of(module))
    if s["gate"]:
        t.mm("output gate", 1, b * lq, e, e)
        t.ew("sigmoid gate (elementwise)", b * lq * e, 5)
        t.inter(b * lq * e)
    t.mm("output projection", 1, b * lq, e, e)
    t.io((3 + s["gate"]) * e * e, b * lq * e, 2 * b * lk * e, b * lq * e)
    kv_cache(t, s["kv_heads"], hd, hd)


def _mha_inputs(s, module):
    x = randn(s["batch"], s["q_len"], s["embed_dim"], dtype=dtype_of(s))
    kv = x if s["kv_len"] == s["q_len"] else randn(s["batch"], s["kv_len"], s["embed_dim"], seed=1, dtype=dtype_of(s))
    return functools.partial(module, need_weights=s["need_weights"]), (x, kv, kv)


def _mha_config(m):
    if _xoptions.any_on(m):
        raise ArgumentError(f"cost: multi-head with the x-transformers options ({_xoptions.describe(m)[2:]}) has no "
                            "cost formula here")
    if not m._qkv_same_embed_dim or m._n_extra or m.inner_dim != m.embed_dim:
        raise ArgumentError("cost: multi-head with kdim/vdim, add_bias_kv, add_zero_attn or heads that do not fill "
                            f"embed_dim (head_dim={m.head_dim}) has no cost formula here")
    return {"embed_dim": m.embed_dim, "heads": m.num_heads, "kv_heads": m.num_kv_heads, "gate": m.gate is not None,
            "qk_norm": m.qk_norm is not None}


def _mha_spec(gate: bool, qk_norm: bool, matches) -> Spec:
    """The multi-head spec (one count for every option); ``matches`` picks which entry prices a module."""
    return Spec(
        {"batch": 2, "q_len": 16, "kv_len": None, "embed_dim": 24, "heads": 3, "kv_heads": None, "need_weights": True,
         "gate": gate, "qk_norm": qk_norm, "dtype": "float32"},
        _mha_count, _mha_inputs, "projections 2 B (Lq E^2 + 2 Lk E E_kv) + output 2 B Lq E^2 (+ gate 2 B Lq E^2); "
        + ATTENTION_FORMULA,
        make=lambda s: MultiHeadAttention(s["embed_dim"], s["heads"], batch_first=True, num_kv_heads=s["kv_heads"],
                                          gate=s["gate"], qk_norm=s["qk_norm"], dtype=dtype_of(s)).eval(),
        length=("q_len", "kv_len"), derive=derive_lengths, module_type=MultiHeadAttention, config=_mha_config,
        matches=matches)


_MHA_SPEC = _mha_spec(False, False, lambda m: m.gate is None and m.qk_norm is None)
_DOT_SPEC = Spec(
    {**ATTENTION_SIZES, "scaled": True, "need_weights": False}, _dot_count,
    lambda s, m: (functools.partial(m, need_weights=s["need_weights"]), attention_inputs(s)), ATTENTION_FORMULA,
    make=lambda s: DotProductAttention(scaled=s["scaled"]).eval(), length=("q_len", "kv_len"), derive=derive_lengths,
    config=lambda m: {"scaled": m.scaled}, module_type=DotProductAttention)
register(Entry("multi-head", MultiHeadAttention, f"{_PAPER}, Sec. 3.2.2", "O(L S E + (L + S) E^2)",
               "h heads of scaled dot-product attention on learned projections; torch.nn.MultiheadAttention "
               "drop-in with grouped-query heads and a KV cache", family="module", example=_mha_example(),
               spec=_MHA_SPEC))
register(Entry("gated-attention", OutputGate, "Qiu et al. 2025, arXiv:2505.06708 (gate at G1; Qwen3-Next)",
               "O(L S E + (L + S) E^2)", "multi-head attention whose output is gated elementwise by "
               "sigmoid(x W_theta) before W^O (here with QK-norm and half of each head rotated, as Qwen3-Next)",
               family="module", example=_mha_example(True, True, {"pairing": "half", "fraction": 0.5}),
               spec=_mha_spec(True, True, lambda m: m.gate is not None)))
register(Entry("qk-norm", QKNorm, "Dehghani et al. 2023, arXiv:2302.05442, Sec. 2 (RMSNorm, as Qwen3)",
               "O(L S E + (L + S) E^2)", "multi-head attention with each head's queries and keys RMS-normalised "
               "before the scores", family="module", example=_mha_example(False, True),
               spec=_mha_spec(False, True, lambda m: m.gate is None and m.qk_norm is not None)))
register(Entry("dot-product-module", DotProductAttention, f"{_PAPER}, Sec. 3.2.1, eq. 1", "O(Lq Lk D)",
               "softmax(q k^T / sqrt(d)) v as a parameter-free module (scaled=False: Luong's dot score)",
               family="module", example=_dot_example, spec=_DOT_SPEC))
