"""Differential attention (Ye et al. 2024): the difference of two softmax maps, normalised per head."""

from __future__ import annotations

import math

import torch
from torch import nn

from .. import masks
from ..core import attention
from ..costing.attend import attend, kv_cache
from ..costing.spec import Spec
from ..costing.tally import dtype_of, randn
from ..errors import ArgumentError, ShapeError, check_int
from ..registry.entry import Entry, register
from .kv_cache import KVCache, check_step, decoding_mask
from .rotary import RotaryEmbedding, rotary_for

__all__ = ["DifferentialAttention", "lambda_init"]


def lambda_init(layer_index: int) -> float:
    """``lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1))`` for layer ``l = layer_index + 1`` (Ye et al. 2024, Sec. 2.1)."""
    return 0.8 - 0.6 * math.exp(-0.3 * check_int("lambda_init", "layer_index", layer_index, 0))


class DifferentialAttention(nn.Module):
    """Differential attention: one softmax map minus a learned multiple of another cancels common-mode noise.

    Ye et al. 2024, "Differential Transformer", arXiv:2410.05258, eqs. 1-3::

        [Q1; Q2] = X W^Q,  [K1; K2] = X W^K,  V = X W^V                                  (d per map, 2d per value)
        DiffAttn(X) = (softmax(Q1 K1^T / sqrt(d)) - lambda softmax(Q2 K2^T / sqrt(d))) V     (eq. 1)
        lambda = exp(l_q1 . l_k1) - exp(l_q2 . l_k2) + lambda_init                           (eq. 2)
        head_i' = (1 - lambda_init) RMSNorm(head_i),  out = Concat(head_1', ..., head_h') W^O  (eq. 3)

    Both maps attend to the same keys, so attention that both give to irrelevant context (the
    "noise") cancels, while the difference keeps the relevant keys sharp; the per-head norm and
    ``1 - lambda_init`` keep the output's scale as in a plain Transformer's.

    Computed as two calls of :func:`attnkit.attention` with ``Dv == D`` (so each keeps its fused and
    block-sparse paths): call ``j`` attends with both maps' queries as ``2 h`` heads (``Q1`` for heads
    ``0 .. h-1``, ``Q2`` after) and the ``j``-th half of every value, ``[softmax_1 V_j; softmax_2 V_j]``;
    the halves are joined after the subtraction. Causal alignment (with a :class:`KVCache`, ``t``
    new queries after ``n - t`` cached; query ``i`` sees keys ``j <= i + n - t``)::

        t=2, n=4:  q0: x x x .
                   q1: x x x x

    Notation: ``h`` = ``num_heads``, ``d = dim / (2 h)``, ``l_q1, l_k1, l_q2, l_k2`` = ``lambda_q1`` ...
    (``d`` each, shared by the layer's heads); projections laid out as ``(map, head, d)`` and values as
    ``(half, head, d)``: transformers' DiffLlama checkpoints load unchanged (:meth:`from_transformers`).

    Differences from the paper: the per-head RMSNorm has no learned scale (as DiffLlama); no dropout.

    Shapes: ``x`` ``(B, t, dim)``, ``key_keep_mask`` ``(B, n)`` bool (True = real token) -> ``(B, t, dim)``.

    Complexity: ``O(B t n h 4 d)`` for the two calls (twice one softmax attention's scores, once its
    values per map), ``O(B t dim^2)`` for the projections; the cache holds ``4 g d`` values a token.

    Args:
        dim: model width, divisible by ``2 num_heads``.
        num_heads: differential heads ``h``.
        num_kv_heads: key/value heads ``g`` dividing ``h`` (grouped-query attention; default ``h``).
        lambda_init: ``lambda_init`` (0.2, the paper's first layer; :func:`lambda_init` gives layer ``l``'s).
        causal: query ``i`` sees keys ``j <= i``.
        rotary: rotary positions on both maps' queries and keys (options as :class:`MultiHeadAttention`'s).
        bias: biases on the four projections.
        head_dim: features ``d`` of each map's queries and keys (default ``dim // (2 num_heads)``); another
            value gives heads that do not fill the model width (``W^Q`` then has ``2 h d`` rows).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> diff = DifferentialAttention(24, 3, rotary=True).eval()
        >>> x = torch.randn(2, 7, 24)
        >>> cache = diff.new_cache(2, 7)
        >>> steps = torch.cat([diff(x[:, :5], cache=cache), diff(x[:, 5:], cache=cache)], 1)
        >>> bool(torch.allclose(steps, diff(x), atol=1e-5)), round(diff.lambda_init, 2)
        (True, 0.2)
    """

    def __init__(self, dim: int, num_heads: int, *, num_kv_heads: int | None = None, lambda_init: float = 0.2,
                 causal: bool = True, rotary: bool | dict | RotaryEmbedding | None = None, bias: bool = False,
                 head_dim: int | None = None):
        super().__init__()
        who = "DifferentialAttention"
        check_int(who, "dim", dim, 1)
        check_int(who, "num_heads", num_heads, 1)
        num_kv_heads = num_heads if num_kv_heads is None else check_int(who, "num_kv_heads", num_kv_heads, 1)
        if head_dim is not None:
            check_int(who, "head_dim", head_dim, 1)
        if (head_dim is None and dim % (2 * num_heads)) or num_heads % num_kv_heads:
            raise ArgumentError(f"{who}: dim must be divisible by 2 * num_heads and num_heads by num_kv_heads; got "
                                f"dim={dim}, num_heads={num_heads}, num_kv_heads={num_kv_heads}")
        if isinstance(lambda_init, bool) or not isinstance(lambda_init, (int, float)) or not math.isfinite(lambda_init):
            raise ArgumentError(f"{who}: lambda_init must be a finite number; got {lambda_init!r}")
        self.dim, self.num_heads, self.num_kv_heads, self.causal = dim, num_heads, num_kv_heads, bool(causal)
        self.head_dim = dim // (2 * num_heads) if head_dim is None else head_dim
        self.lambda_init = float(lambda_init)
        inner, kv = 2 * num_heads * self.head_dim, 2 * num_kv_heads * self.head_dim
        self.q_proj, self.out_proj = nn.Linear(dim, inner, bias=bias), nn.Linear(inner, dim, bias=bias)
        self.k_proj, self.v_proj = nn.Linear(dim, kv, bias=bias), nn.Linear(dim, kv, bias=bias)
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(self.head_dim) * 0.1) for _ in range(4))
        self.norm = nn.RMSNorm(2 * self.head_dim, eps=1e-5, elementwise_affine=False)
        self.rotary = rotary_for(who, rotary, self.head_dim)

    def new_cache(self, batch: int, max_len: int, *, dtype=None, device=None) -> KVCache:
        """An empty :class:`KVCache` of ``2 num_kv_heads`` heads (both maps' keys, both values' halves)."""
        w = self.out_proj.weight
        return KVCache(batch, max_len, 2 * self.num_kv_heads, self.head_dim, dtype=dtype or w.dtype,
                       device=device or w.device)

    def weight(self) -> torch.Tensor:
        """``lambda`` (eq. 2), a 0-d tensor."""
        return (torch.exp(self.lambda_q1 @ self.lambda_k1) - torch.exp(self.lambda_q2 @ self.lambda_k2)
                + self.lambda_init)

    def _heads(self, t, heads):
        return t.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)  # (B, t, heads d) -> (B, heads, t, d)

    def forward(self, x: torch.Tensor, *, key_keep_mask: torch.Tensor | None = None,
                cache: KVCache | None = None) -> torch.Tensor:
        who = type(self).__name__
        x, start = check_step(who, self, x, self.dim, key_keep_mask, cache)
        h, g = self.num_heads, self.num_kv_heads
        q, k, v = self._heads(self.q_proj(x), 2 * h), self._heads(self.k_proj(x), 2 * g), self._heads(
            self.v_proj(x), 2 * g)  # [Q1; Q2], [K1; K2], [V_0; V_1] as heads
        if self.rotary is not None:
            q, k = self.rotary(q, k, q_offset=start, k_offset=start)
        if cache is not None:
            if cache.shape[1:] != (2 * g, cache.capacity, self.head_dim):
                raise ShapeError(f"{who}: cache must have {2 * g} heads of {self.head_dim} features (new_cache); "
                                 f"got {cache.shape}")
            k, v = cache.append(k, v)  # (B, 2g, n, d)
        mask = decoding_mask(self.causal, None, x.shape[1], k.shape[2], key_keep_mask)
        lam = self.weight()
        halves = []
        for half in (v[:, :g], v[:, g:]):
            out = attention(q, k, torch.cat([half, half], dim=1), mask=mask)  # (B, 2h, t, d): map 1, then map 2
            halves.append(out[:, :h] - lam * out[:, h:])
        out = (1 - self.lambda_init) * self.norm(torch.cat(halves, dim=-1))  # (B, h, t, 2d)
        return self.out_proj(out.transpose(1, 2).flatten(2))  # (B, t, h 2d)

    @classmethod
    def from_transformers(cls, layer) -> DifferentialAttention:
        """The equivalent module of a transformers DiffLlama attention layer (weights, lambdas, rotary copied)."""
        from ..integrations.transformers_layers import differential_from_transformers

        return differential_from_transformers(cls, layer)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"lambda_init={self.lambda_init:g}, causal={self.causal}")


def _count(t, s, module=None):
    b, n, dim, h, g = s["batch"], s["length"], s["dim"], s["heads"], s["kv_heads"]
    d, bn = dim // (2 * h), b * n
    t.mm("projections (q, k, v, out)", 1, bn, dim, dim)
    t.mm("projections (q, k, v, out)", 2, bn, dim, 2 * g * d)
    mask = {"mask": masks.causal()} if s["causal"] else {}
    for call in ("map 1 and map 2, value half 1: ", "map 1 and map 2, value half 2: "):
        attend(t, call, b, 2 * h, n, n, d, d, hkv=2 * g, dtype=dtype_of(s), **mask)
    t.ew("difference, RMSNorm (elementwise)", bn * dim, 7)
    t.mm("projections (q, k, v, out)", 1, bn, dim, dim)
    t.io(bn * dim, 2 * dim * dim + 4 * dim * g * d, bn * dim)
    kv_cache(t, g, 2 * d, 2 * d)  # each key head holds both maps' keys (2d), each value head 2d features


def _make(s):
    return DifferentialAttention(s["dim"], s["heads"], num_kv_heads=s["kv_heads"], causal=s["causal"]).to(
        dtype_of(s)).eval()


def _config(m):
    if 2 * m.num_heads * m.head_dim != m.dim:
        raise ArgumentError(f"cost: differential attention whose heads do not fill dim (head_dim={m.head_dim}, "
                            f"dim={m.dim}) has no cost formula here")
    return {"dim": m.dim, "heads": m.num_heads, "kv_heads": m.num_kv_heads, "causal": m.causal}


def _example():
    torch.manual_seed(0)
    return DifferentialAttention(24, 3, rotary=True).eval(), (randn(2, 16, 24),)


register(Entry(
    "differential", DifferentialAttention, "Ye et al. 2024, arXiv:2410.05258, eqs. 1-3", "O(L S h 4 d)",
    "(softmax(Q1 K1^T) - lambda softmax(Q2 K2^T)) V per head, RMS-normalised: common-mode attention cancels",
    family="module", example=_example,
    spec=Spec({"batch": 2, "length": 16, "dim": 24, "heads": 3, "kv_heads": None, "causal": True, "dtype": "float32"},
              _count, lambda s, m: (m, (randn(s["batch"], s["length"], s["dim"], dtype=dtype_of(s)),)),
              "projections 2 B L dim (2 dim + 4 g d); two calls of 2h-head attention with D = Dv = d",
              make=_make, length=("length",), derive=lambda s: {**s, "kv_heads": s["kv_heads"] or s["heads"]},
              config=_config,
              module_type=DifferentialAttention, nullable=frozenset({"kv_heads"}))))
