"""Transformer encoder and decoder layers (Vaswani et al. 2017) around any self-attention module."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import masks
from ..errors import ArgumentError, check_int
from ..nn.multihead import MultiHeadAttention
from .self_attention import SoftmaxSelfAttention, self_attend

__all__ = ["TransformerEncoderLayer", "TransformerDecoderLayer", "make_norm", "ACTIVATIONS", "NORMS"]

_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu}
# gated linear units: the activation of the gate half (Shazeer 2020, arXiv:2002.05202, eq. 5-6); "geglu-tanh" is
# GELU's tanh approximation (Hendrycks & Gimpel 2016, arXiv:1606.08415, Sec. 2), Gemma's feed-forward network
_GLU = {"swiglu": F.silu, "geglu": F.gelu, "geglu-tanh": lambda x: F.gelu(x, approximate="tanh")}
ACTIVATIONS = (*_ACTIVATIONS, *_GLU)
NORMS = ("layer", "rms")


def make_norm(who: str, kind: str, dim: int, eps: float) -> nn.Module:
    """LayerNorm (Ba et al. 2016, arXiv:1607.06450) or RMSNorm (Zhang & Sennrich 2019, arXiv:1910.07467,
    eq. 4: no centring, no bias)."""
    if kind not in NORMS:
        raise ArgumentError(f"{who}: norm must be one of {NORMS}; got {kind!r}")
    return nn.LayerNorm(dim, eps=eps) if kind == "layer" else nn.RMSNorm(dim, eps=eps)


def check_dropout(who: str, p) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p < 1:
        raise ArgumentError(f"{who}: dropout must be a float in [0, 1); got {p!r}")
    return float(p)


class _Sublayers(nn.Module):
    """What both layers share: the feed-forward network, dropout, norm placement (names as torch's layers)."""

    def __init__(self, who: str, dim: int, ff_dim: int | None, dropout: float, activation: str, norm_first: bool,
                 eps: float, norm: str):
        super().__init__()
        check_int(who, "dim", dim, 1)
        if activation not in ACTIVATIONS:
            raise ArgumentError(f"{who}: activation must be one of {ACTIVATIONS}; got {activation!r}")
        glu = activation in _GLU
        default = -(-8 * dim // 3) if glu else 4 * dim  # a GLU's 3 matrices: 2/3 the width, the same parameters
        ff_dim = default if ff_dim is None else check_int(who, "ff_dim", ff_dim, 1)
        self.dim, self.ff_dim, self.activation, self.norm_first = dim, ff_dim, activation, bool(norm_first)
        self.dropout = check_dropout(who, dropout)
        self.norm_kind, self.eps = norm, eps
        # SwiGLU and GEGLU: W and V stacked in linear1, no biases (Shazeer 2020, Sec. 2)
        self.linear1 = nn.Linear(dim, 2 * ff_dim if glu else ff_dim, bias=not glu)
        self.linear2 = nn.Linear(ff_dim, dim, bias=not glu)
        self.norm1 = make_norm(who, norm, dim, eps)

    def _drop(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, self.dropout, training=self.training) if self.dropout else x

    def _ff(self, x: torch.Tensor) -> torch.Tensor:
        """``FFN(x) = max(0, x W_1 + b_1) W_2 + b_2`` (eq. 2; GELU when asked), or SwiGLU
        ``(Swish(x W) * x V) W_2`` and GEGLU ``(GELU(x W) * x V) W_2`` (Shazeer 2020, "GLU Variants Improve
        Transformer", arXiv:2002.05202, eq. 6)."""
        glu = _GLU.get(self.activation)
        if glu is not None:
            gate, up = self.linear1(x).chunk(2, dim=-1)  # (B, n, 2 ff) -> 2 x (B, n, ff)
            h = glu(gate) * up
        else:
            h = _ACTIVATIONS[self.activation](self.linear1(x))
        return self.linear2(self._drop(h) if self.dropout else h)

    def _residual(self, x: torch.Tensor, norm: nn.Module, sublayer) -> torch.Tensor:
        """Post-norm ``LN(x + Sublayer(x))`` (Sec. 5.4) or pre-norm ``x + Sublayer(LN(x))``."""
        y = sublayer(norm(x) if self.norm_first else x)
        if self.dropout:
            y = self._drop(y)
        return x + y if self.norm_first else norm(x + y)

    def extra_repr(self) -> str:
        return (f"ff_dim={self.ff_dim}, activation={self.activation!r}, norm_first={self.norm_first}, "
                f"norm={self.norm_kind!r}")


class TransformerEncoderLayer(_Sublayers):
    """One encoder layer: self-attention then a position-wise feed-forward network, each residual + LayerNorm.

    Vaswani et al. 2017, "Attention Is All You Need", arXiv:1706.03762, Sec. 3.1 and eq. 2::

        post-norm (paper):  x = LN(x + SelfAttn(x));   x = LN(x + FFN(x))
        pre-norm:           x = x + SelfAttn(LN(x));   x = x + FFN(LN(x))
        FFN(x) = max(0, x W_1 + b_1) W_2 + b_2

    Notation: ``W_1, W_2`` = ``linear1, linear2``; the two LNs = ``norm1, norm2`` (parameter names as
    ``torch.nn.TransformerEncoderLayer``); ``SelfAttn`` = ``self_attn``, any module ``(B, n, dim) -> (B, n, dim)``.

    Differences from the paper: the self-attention is a parameter (see :class:`TransformerEncoder`);
    pre-norm (Xiong et al. 2020, arXiv:2002.04745) and GELU are options.

    Shapes: ``x`` ``(B, n, dim)``, ``key_keep_mask`` ``(B, n)`` bool (True = real token) -> ``(B, n, dim)``.

    Complexity: ``O(B n dim ff_dim)`` plus the self-attention's cost.

    Args:
        dim: model width.
        self_attn: the self-attention module.
        ff_dim: hidden width of the FFN (``4 dim``).
        dropout: on each sublayer output and inside the FFN, training only.
        activation: "relu", "gelu", or a gated unit: "swiglu", "geglu", "geglu-tanh" (GELU's tanh approximation,
            Gemma's; ``ff_dim`` then defaults to ``8 dim / 3``).
        norm_first: pre-norm instead of post-norm.
        eps: the norms' epsilon.
        norm: "layer" (LayerNorm) or "rms" (RMSNorm, as Llama).

    Example:
        >>> import torch
        >>> from attnkit.models.self_attention import SoftmaxSelfAttention
        >>> _ = torch.manual_seed(0)
        >>> layer = TransformerEncoderLayer(12, SoftmaxSelfAttention(12, 3), ff_dim=20)
        >>> layer(torch.randn(2, 5, 12)).shape
        torch.Size([2, 5, 12])
    """

    def __init__(self, dim: int, self_attn: nn.Module, *, ff_dim: int | None = None, dropout: float = 0.0,
                 activation: str = "relu", norm_first: bool = False, eps: float = 1e-5, norm: str = "layer"):
        super().__init__("TransformerEncoderLayer", dim, ff_dim, dropout, activation, norm_first, eps, norm)
        self.self_attn = self_attn
        self.norm2 = make_norm("TransformerEncoderLayer", norm, dim, eps)

    def forward(self, x: torch.Tensor, *, key_keep_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = self._residual(x, self.norm1, lambda h: self_attend(self.self_attn, h, key_keep_mask))
        return self._residual(x, self.norm2, self._ff)


class TransformerDecoderLayer(_Sublayers):
    """One decoder layer: causal self-attention, cross-attention to the encoder output, feed-forward.

    Vaswani et al. 2017, arXiv:1706.03762, Sec. 3.1 and 3.2.3 (post-norm form; pre-norm as in
    :class:`TransformerEncoderLayer`)::

        x = LN(x + SelfAttn(x))              queries i see targets j <= i (causal)
        x = LN(x + CrossAttn(x, memory))     every (unpadded) encoder position; skipped when cross=False
        x = LN(x + FFN(x))

    Notation: ``self_attn``, ``multihead_attn`` (cross), ``linear1/2``, ``norm1/2/3`` as
    ``torch.nn.TransformerDecoderLayer``. ``cross=False`` gives the decoder-only (language model) layer.

    Differences from the paper: the self-attention is a parameter and must be causal itself (the
    models build it so); decoding against a :class:`attnkit.nn.KVCache` via ``cache``.

    Shapes: ``x`` ``(B, t, dim)``, ``memory`` ``(B, s, dim)``, ``memory_keep_mask`` ``(B, s)`` and
    ``key_keep_mask`` ``(B, n)`` bool (True = real token) -> ``(B, t, dim)``.

    Complexity: ``O(B t (n + s) dim + B t dim ff_dim)`` plus projections.

    Args:
        dim: model width.
        self_attn: causal self-attention module.
        num_heads: heads of the cross-attention.
        cross: whether the layer has cross-attention.
        ff_dim, dropout, activation, norm_first, eps, norm: as :class:`TransformerEncoderLayer`.

    Example:
        >>> import torch
        >>> from attnkit.models.self_attention import SoftmaxSelfAttention
        >>> _ = torch.manual_seed(0)
        >>> layer = TransformerDecoderLayer(12, SoftmaxSelfAttention(12, 3, causal=True), num_heads=3)
        >>> layer(torch.randn(2, 5, 12), torch.randn(2, 7, 12)).shape
        torch.Size([2, 5, 12])
    """

    def __init__(self, dim: int, self_attn: nn.Module, *, num_heads: int = 1, cross: bool = True,
                 ff_dim: int | None = None, dropout: float = 0.0, activation: str = "relu",
                 norm_first: bool = False, eps: float = 1e-5, norm: str = "layer"):
        who = "TransformerDecoderLayer"
        super().__init__(who, dim, ff_dim, dropout, activation, norm_first, eps, norm)
        self.self_attn = self_attn
        self.multihead_attn = MultiHeadAttention(dim, num_heads, dropout, batch_first=True) if cross else None
        self.norm2 = make_norm(who, norm, dim, eps) if cross else None
        self.norm3 = make_norm(who, norm, dim, eps)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None, *,
                memory_keep_mask: torch.Tensor | None = None, key_keep_mask: torch.Tensor | None = None,
                cache=None, tree=None) -> torch.Tensor:
        attn = self.self_attn
        plain = not self.dropout and self.norm_first  # pre-norm without dropout: _residual's sums written out
        if tree is None and type(attn) is SoftmaxSelfAttention:  # the common layer: no adapter between
            if plain:
                x = x + attn(self.norm1(x), key_keep_mask=key_keep_mask, cache=cache)
            else:
                x = self._residual(x, self.norm1, lambda h: attn(h, key_keep_mask=key_keep_mask, cache=cache))
        else:
            x = self._residual(x, self.norm1, lambda h: self_attend(attn, h, key_keep_mask, cache, tree))
        if self.multihead_attn is not None:
            if memory is None:
                raise ArgumentError("TransformerDecoderLayer: memory (the encoder output) is required with "
                                    "cross-attention; got None")
            keep = None if memory_keep_mask is None else masks.keys(memory_keep_mask)
            x = self._residual(x, self.norm2,
                               lambda h: self.multihead_attn(h, memory, memory, need_weights=False, mask=keep)[0])
        return x + self._ff(self.norm3(x)) if plain else self._residual(x, self.norm3, self._ff)
