"""Stacks of Transformer layers over ``(batch, n, dim)`` features, with a choice of self-attention."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ArgumentError, check_int
from ..nn._inputs import check_keep_mask, check_sequence
from ..nn._recurrent import RecurrentLayer
from ..nn.kv_cache import KVCache
from .blocks import TransformerDecoderLayer, TransformerEncoderLayer, make_norm
from .self_attention import SoftmaxSelfAttention, self_attention_maker
from .tokens import cache_offset

__all__ = ["TransformerEncoder", "TransformerDecoder"]

_ATTENTION_DOC = """
    The ``attention`` argument (the same for every model in :mod:`attnkit.models`):

    - ``"softmax"`` (alias ``"multi-head"``): :class:`SoftmaxSelfAttention`, a
      :class:`attnkit.nn.MultiHeadAttention` with the optional ``attention_mask`` (any
      :mod:`attnkit.masks` mask, ANDed with causal and key padding), rotary positions (``rotary``:
      True or :class:`~attnkit.nn.RotaryEmbedding` options: pairing, partial rotation, scaling),
      the output gate (``gate``) and QK-norm (``qk_norm``), KV cache.
    - a registry name, built with defaults for short sequences: "linear-attention", "performer",
      "local" (window 8), "sparse-transformer" (strided, stride 8), "block-sparse" (fixed blocks of
      8), "reformer" (4 buckets, 2 hashes, chunks of 16), and, without a causal form (encoders only),
      "longformer" (window 16), "bigbird" (blocks of 8), "linformer" (k = max_len // 4) and
      "lambda-layer" (the last two need ``max_len``).
    - a factory ``(dim, num_heads) -> nn.Module`` mapping ``(B, n, dim)`` to ``(B, n, dim)``, called
      once per layer; it gets ``causal=True`` in a decoder if it takes a ``causal`` argument
      (otherwise it must be causal itself there), and ``key_keep_mask`` at run time if its
      ``forward`` takes one (e.g. ``functools.partial(LocalAttention, size=4)``).

    Unknown names raise ArgumentError listing the valid ones; so do a non-causal mechanism in a
    decoder, ``attention_mask``, rotary positions, a gate or QK-norm without softmax, and padding (a ``False`` in a
    keep mask) with a module that takes no ``key_keep_mask``.
"""


def _stack_args(who, dim, num_heads, num_layers, eps, head_dim=None):
    check_int(who, "dim", dim, 1)
    check_int(who, "num_heads", num_heads, 1)
    check_int(who, "num_layers", num_layers, 0)
    if head_dim is None and dim % num_heads:
        raise ArgumentError(f"{who}: dim must be divisible by num_heads; got dim={dim}, num_heads={num_heads}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        raise ArgumentError(f"{who}: eps must be a number > 0; got {eps!r}")


class TransformerEncoder(nn.Module):
    """A stack of :class:`TransformerEncoderLayer` (bidirectional self-attention + FFN), any attention.

    Vaswani et al. 2017, arXiv:1706.03762, Sec. 3.1: ``num_layers`` identical layers
    ``x = LN(x + SelfAttn(x)); x = LN(x + FFN(x))`` (post-norm), or pre-norm
    ``x = x + SelfAttn(LN(x)); x = x + FFN(LN(x))`` followed by a final LN (``norm``).
    With ``norm_first=False``, ``attention="softmax"`` and ReLU it computes what
    ``torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(..., batch_first=True))`` does,
    and loads its state_dict.
    {attention}
    Differences from the paper: the attention mechanism, pre-norm and GELU are options.

    Shapes: ``x`` ``(B, n, dim)``, ``key_keep_mask`` ``(B, n)`` bool (True = real token) -> ``(B, n, dim)``.

    Complexity: ``num_layers`` x (``O(B n dim ff_dim)`` + the attention's cost; softmax ``O(B n^2 dim)``).

    Args:
        dim: model width.
        num_heads: heads.
        num_layers: layers.
        ff_dim: FFN width (``4 dim``).
        dropout: sublayer, FFN and softmax-weight dropout, training only.
        activation: "relu", "gelu", "swiglu", "geglu" or "geglu-tanh".
        norm_first: pre-norm.
        attention: see above.
        attention_mask: an attnkit mask (softmax only).
        rotary: rotary positions in the softmax attention (True or RotaryEmbedding options).
        max_len: longest input (linformer, lambda-layer).
        eps: the norms' epsilon.
        norm: "layer" (LayerNorm) or "rms" (RMSNorm).
        gate, qk_norm: the softmax attention's output gate and QK-norm.
        head_dim, num_kv_heads: the softmax attention's head width (default ``dim / num_heads``) and
            grouped-query key/value heads (:class:`~attnkit.nn.MultiHeadAttention`).
        attention_bias: the softmax attention's projection biases: True, False or "qkv" (Q, K, V only).

    Example:
        >>> import torch
        >>> from attnkit import masks
        >>> _ = torch.manual_seed(0)
        >>> enc = TransformerEncoder(12, 3, 2, attention_mask=masks.sliding_window(2, 2))
        >>> enc(torch.randn(2, 5, 12), key_keep_mask=torch.tensor([[True] * 5, [True] * 3 + [False] * 2])).shape
        torch.Size([2, 5, 12])
        >>> TransformerEncoder(12, 3, 2, attention="performer")(torch.randn(2, 5, 12)).shape
        torch.Size([2, 5, 12])
    """

    def __init__(self, dim: int, num_heads: int, num_layers: int = 2, *, ff_dim: int | None = None,
                 dropout: float = 0.0, activation: str = "relu", norm_first: bool = False, attention="softmax",
                 attention_mask=None, rotary: bool | dict = False, max_len: int | None = None, eps: float = 1e-5,
                 norm: str = "layer", gate: bool = False, qk_norm: bool = False, head_dim: int | None = None,
                 num_kv_heads: int | None = None, attention_bias: bool | str = True):
        super().__init__()
        who = type(self).__name__
        _stack_args(who, dim, num_heads, num_layers, eps, head_dim)
        make = self_attention_maker(who, attention, dim, num_heads, causal=False, dropout=dropout,
                                    mask=attention_mask, rotary=rotary, max_len=max_len, gate=gate, qk_norm=qk_norm,
                                    head_dim=head_dim, num_kv_heads=num_kv_heads, attention_bias=attention_bias)
        self.dim = dim
        self.layers = nn.ModuleList(TransformerEncoderLayer(dim, make(), ff_dim=ff_dim, dropout=dropout,
                                                            activation=activation, norm_first=norm_first, eps=eps,
                                                            norm=norm)
                                    for _ in range(num_layers))
        self.norm = make_norm(who, norm, dim, eps) if norm_first else None

    def forward(self, x: torch.Tensor, *, key_keep_mask: torch.Tensor | None = None) -> torch.Tensor:
        who = type(self).__name__
        check_sequence(who, "x", x, self.dim, named=True, like=self)
        keep = check_keep_mask(who, "key_keep_mask", key_keep_mask, *x.shape[:2])
        for layer in self.layers:
            x = layer(x, key_keep_mask=keep)
        return x if self.norm is None else self.norm(x)


class TransformerDecoder(nn.Module):
    """A stack of :class:`TransformerDecoderLayer`: causal self-attention, optional cross-attention, FFN.

    Vaswani et al. 2017, arXiv:1706.03762, Sec. 3.1 and 3.2.3: each layer attends causally to the
    targets (query ``i`` sees positions ``j <= i``; with a KV cache, bottom-right aligned), then to the
    encoder output ``memory``, then applies the FFN; post-norm, or pre-norm with a final LN.
    ``cross=False`` drops the cross-attention: the decoder-only stack of a language model
    (Radford et al. 2018). With softmax attention, post-norm and ReLU it matches
    ``torch.nn.TransformerDecoder(..., batch_first=True)`` with a causal ``tgt_mask``.
    {attention}
    Differences from the paper: as :class:`TransformerEncoder`; incremental decoding with
    :meth:`new_caches` (softmax attention only).

    Shapes: ``x`` ``(B, t, dim)``, ``memory`` ``(B, s, dim)``, ``memory_keep_mask`` ``(B, s)``,
    ``key_keep_mask`` ``(B, n)`` bool (True = real token; ``n = t``, or cached + ``t``) -> ``(B, t, dim)``.

    Complexity: ``num_layers`` x (``O(B t (n + s) dim + B t dim ff_dim)`` for softmax attention).

    Args:
        dim, num_heads, num_layers, ff_dim, dropout, activation: as :class:`TransformerEncoder`.
        norm_first, attention, attention_mask, rotary, max_len, eps: as :class:`TransformerEncoder`.
        norm, gate, qk_norm, head_dim, num_kv_heads, attention_bias: as :class:`TransformerEncoder`.
        cross: with cross-attention to ``memory``.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> dec = TransformerDecoder(12, 3, 2).eval()
        >>> x, memory = torch.randn(2, 5, 12), torch.randn(2, 7, 12)
        >>> full = dec(x, memory)
        >>> caches = dec.new_caches(2, 5)
        >>> steps = torch.cat([dec(x[:, :4], memory, caches=caches), dec(x[:, 4:], memory, caches=caches)], 1)
        >>> torch.allclose(steps, full, atol=1e-5)
        True
    """

    def __init__(self, dim: int, num_heads: int, num_layers: int = 2, *, cross: bool = True,
                 ff_dim: int | None = None, dropout: float = 0.0, activation: str = "relu", norm_first: bool = False,
                 attention="softmax", attention_mask=None, rotary: bool | dict = False, max_len: int | None = None,
                 eps: float = 1e-5, norm: str = "layer", gate: bool = False, qk_norm: bool = False,
                 head_dim: int | None = None, num_kv_heads: int | None = None, attention_bias: bool | str = True):
        super().__init__()
        who = type(self).__name__
        _stack_args(who, dim, num_heads, num_layers, eps, head_dim)
        make = self_attention_maker(who, attention, dim, num_heads, causal=True, dropout=dropout,
                                    mask=attention_mask, rotary=rotary, max_len=max_len, gate=gate, qk_norm=qk_norm,
                                    head_dim=head_dim, num_kv_heads=num_kv_heads, attention_bias=attention_bias)
        self.dim, self.cross = dim, bool(cross)
        self.layers = nn.ModuleList(TransformerDecoderLayer(
            dim, make(), num_heads=num_heads, cross=cross, ff_dim=ff_dim, dropout=dropout, activation=activation,
            norm_first=norm_first, eps=eps, norm=norm) for _ in range(num_layers))
        self.norm = make_norm(who, norm, dim, eps) if norm_first else None

    @property
    def cacheable(self) -> bool:
        """Whether every self-attention can decode against a cache: softmax attention (a KV cache) or a
        linear-recurrent layer (its state), as in the hybrid stacks (:mod:`attnkit.models.hybrid`)."""
        return all(isinstance(layer.self_attn, (SoftmaxSelfAttention, RecurrentLayer)) for layer in self.layers)

    def new_caches(self, batch: int, max_len: int, *, kv_format=None) -> list:
        """One empty cache per layer, for ``forward(..., caches=)``: a :class:`KVCache` per softmax layer
        (``kv_format``: quantized storage, :class:`~attnkit.functional.quantize.KVFormat` or a kind's name), a
        :class:`~attnkit.nn.RecurrentCache` per linear-recurrent layer."""
        if not self.cacheable:
            raise ArgumentError(f"{type(self).__name__}: a cache needs softmax attention or linear-recurrent layers; "
                                f"got {type(self.layers[0].self_attn).__name__}")
        return [layer.self_attn.new_cache() if isinstance(layer.self_attn, RecurrentLayer) else
                layer.self_attn.new_cache(batch, max_len, kv_format=kv_format) for layer in self.layers]

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None, *,
                memory_keep_mask: torch.Tensor | None = None, key_keep_mask: torch.Tensor | None = None,
                caches: list[KVCache] | None = None) -> torch.Tensor:
        who = type(self).__name__
        check_sequence(who, "x", x, self.dim, named=True, like=self)
        if self.cross:
            if memory is None:
                raise ArgumentError(f"{who}: memory (the encoder output) is required with cross=True; got None")
            check_sequence(who, "memory", memory, self.dim, batch=x.shape[0], named=True, like=self)
            check_keep_mask(who, "memory_keep_mask", memory_keep_mask, *memory.shape[:2])
        elif memory is not None:
            raise ArgumentError(f"{who}: memory given to a decoder built with cross=False")
        n = x.shape[1] + cache_offset(who, caches, len(self.layers))
        keep = check_keep_mask(who, "key_keep_mask", key_keep_mask, x.shape[0], n)
        return self.run_layers(x, memory, memory_keep_mask=memory_keep_mask, key_keep_mask=keep, caches=caches)

    def run_layers(self, x: torch.Tensor, memory: torch.Tensor | None = None, *,
                   memory_keep_mask: torch.Tensor | None = None, key_keep_mask: torch.Tensor | None = None,
                   caches: list[KVCache] | None = None, tree=None) -> torch.Tensor:
        """:meth:`forward` without its checks, for callers that made or checked every input themselves
        (a model's decoding step: the embedding of tokens it chose, its own caches; ``tree``: the tokens are
        a draft tree after the caches, a :func:`attnkit.masks.tree`)."""
        if memory is None and memory_keep_mask is None and key_keep_mask is None and tree is None:
            for i, layer in enumerate(self.layers):  # a decoder-only step: the layers' defaults, no keywords to pass
                x = layer(x, cache=None if caches is None else caches[i])
        else:
            for i, layer in enumerate(self.layers):
                x = layer(x, memory, memory_keep_mask=memory_keep_mask, key_keep_mask=key_keep_mask,
                          cache=None if caches is None else caches[i], tree=tree)
        return x if self.norm is None else self.norm(x)


TransformerEncoder.__doc__ = TransformerEncoder.__doc__.replace("{attention}", _ATTENTION_DOC)
TransformerDecoder.__doc__ = TransformerDecoder.__doc__.replace("{attention}", _ATTENTION_DOC)
