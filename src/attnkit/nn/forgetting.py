"""The Forgetting Transformer's attention layer (FoX): causal softmax attention with a learned forget gate."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import masks
from ..core import attention
from ..costing.attend import attend, kv_cache
from ..costing.spec import Spec
from ..costing.tally import dtype_of, randn, zeros
from ..errors import ShapeError, check_int
from ..functional.forgetting import ForgetGateBias
from ..registry.entry import Entry, register
from .kv_cache import KVCache, check_step, decoding_mask

__all__ = ["ForgettingAttention", "ForgetCache"]


class ForgetCache(KVCache):
    """A :class:`KVCache` that also keeps the running sums ``F`` of the log forget gates, ``(B, H, capacity)``.

    :meth:`append_gates` adds ``t`` new positions' log gates after the stored ones and returns ``F``
    over every stored position (call it before :meth:`append`, which advances the length). ``F`` is
    held in float32 (float64 for float64 caches).
    """

    def __init__(self, batch: int, capacity: int, kv_heads: int, head_dim: int, num_heads: int, *, dtype=None,
                 device=None):
        super().__init__(batch, capacity, kv_heads, head_dim, dtype=dtype, device=device)
        self._f = torch.zeros(batch, num_heads, self.capacity, dtype=torch.promote_types(self.dtype, torch.float32),
                              device=self.device)

    def append_gates(self, log_fgate: torch.Tensor) -> torch.Tensor:
        """``log_fgate`` ``(B, H, t)`` of the next ``t`` positions -> ``F`` ``(B, H, n + t)`` over all of them."""
        start, stop = len(self), len(self) + log_fgate.shape[-1]
        if log_fgate.shape[:2] != self._f.shape[:2] or stop > self.capacity:
            raise ShapeError(f"ForgetCache.append_gates: log_fgate must have shape (B, H, t) = "
                             f"({self._f.shape[0]}, {self._f.shape[1]}, at most {self.capacity - start}); "
                             f"got {tuple(log_fgate.shape)}")
        before = self._f[:, :, start - 1:start] if start else 0.0
        new = before + log_fgate.to(self._f.dtype).cumsum(-1)
        if torch.is_grad_enabled() and (new.requires_grad or self._f.requires_grad):
            self._f = torch.cat([self._f[:, :, :start], new, self._f[:, :, stop:]], -1)  # earlier graphs keep theirs
        else:
            self._f[:, :, start:stop] = new
        return self._f[:, :, :stop]


class ForgettingAttention(nn.Module):
    """FoX's attention layer: each head's attention decays with the product of the forget gates in between.

    Lin et al. 2025, "Forgetting Transformer: Softmax Attention with a Forget Gate", ICLR 2025,
    arXiv:2503.02130, eq. 3-5::

        q, k, v = x W_Q, x W_K, x W_V;     f_t = sigmoid(x_t w_f + b_f)   (one gate per head)
        F_i = sum_{l <= i} log f_l;       o_i = sum_{j <= i} softmax_j(q_i^T k_j / sqrt(d) + F_i - F_j) v_j
        y = o W_O

    the attention :func:`attnkit.functional.forgetting.forgetting_attention` (the bias ``F_i - F_j``
    built block by block, O(L) memory on the chunked paths, forward and backward). Notation:
    ``W_Q, W_K, W_V, W_O, (w_f, b_f)`` = ``q_proj, k_proj, v_proj, out_proj, fgate_proj``.

    Differences from the paper: the basic layer (no "Pro" output gate, QK-norm or key shift); no
    positional embedding, as the paper's FoX (the forget gate is the position signal).

    Shapes: ``x`` ``(B, t, dim)``, ``key_keep_mask`` ``(B, n)`` bool over the cached and new
    positions (True = real token; a padded token neither decays nor is attended to) -> ``(B, t, dim)``;
    with ``cache`` (:meth:`new_cache`) the ``t`` tokens follow the cached ones.

    Complexity: O(L^2 dim) time, O(L dim) memory per layer on the chunked paths; decoding keeps
    ``Hkv 2 d`` numbers per token plus the running gate sum, ``H`` per token.

    Args:
        dim: model width.
        num_heads: query heads H (``dim % H == 0``).
        num_kv_heads: key/value heads (H a multiple; default H).
        bias: biases in the q, k, v and output projections (the gate always has one).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = ForgettingAttention(16, 4, num_kv_heads=2)
        >>> x = torch.randn(2, 9, 16)
        >>> cache = layer.new_cache(2, 9)
        >>> parts = [layer(x[:, :4], cache=cache)] + [layer(x[:, t:t + 1], cache=cache) for t in range(4, 9)]
        >>> torch.allclose(torch.cat(parts, 1), layer(x), atol=1e-5)
        True
    """

    def __init__(self, dim: int, num_heads: int, *, num_kv_heads: int | None = None, bias: bool = False):
        super().__init__()
        who = "ForgettingAttention"
        heads, kv = check_int(who, "num_heads", num_heads, 1), num_kv_heads or num_heads
        if check_int(who, "dim", dim, 1) % heads or heads % check_int(who, "num_kv_heads", kv, 1):
            raise ShapeError(f"{who}: dim must be a multiple of num_heads and num_heads of num_kv_heads; got "
                             f"dim={dim}, num_heads={heads}, num_kv_heads={kv}")
        self.dim, self.num_heads, self.num_kv_heads, self.head_dim = dim, heads, kv, dim // heads
        self.q_proj = nn.Linear(dim, dim, bias=bias)
        self.k_proj, self.v_proj = (nn.Linear(dim, kv * self.head_dim, bias=bias) for _ in range(2))
        self.fgate_proj = nn.Linear(dim, heads)
        self.out_proj = nn.Linear(dim, dim, bias=bias)

    def new_cache(self, batch: int, max_len: int, *, dtype=None, device=None) -> ForgetCache:
        """An empty :class:`ForgetCache` for ``batch`` sequences of at most ``max_len`` positions."""
        w = self.out_proj.weight
        return ForgetCache(batch, max_len, self.num_kv_heads, self.head_dim, self.num_heads, dtype=dtype or w.dtype,
                           device=device or w.device)

    def _heads(self, t, heads):
        return t.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)  # (B, t, heads d) -> (B, heads, t, d)

    def forward(self, x: torch.Tensor, *, key_keep_mask: torch.Tensor | None = None,
                cache: ForgetCache | None = None) -> torch.Tensor:
        who = type(self).__name__
        x, start = check_step(who, self, x, self.dim, key_keep_mask, cache, kind=ForgetCache)
        q = self._heads(self.q_proj(x), self.num_heads)
        k, v = self._heads(self.k_proj(x), self.num_kv_heads), self._heads(self.v_proj(x), self.num_kv_heads)
        log_f = F.logsigmoid(self.fgate_proj(x)).transpose(1, 2)  # (B, H, t)
        if key_keep_mask is not None:  # a padded token keeps the state: f = 1
            log_f = log_f.masked_fill(~key_keep_mask[:, None, start:], 0.0)
        if cache is None:
            cumulative = log_f.to(torch.promote_types(log_f.dtype, torch.float32)).cumsum(-1)
        else:
            cumulative = cache.append_gates(log_f)
            k, v = cache.append(k, v)
        mask = decoding_mask(True, None, x.shape[1], k.shape[2], key_keep_mask)
        out = attention(q, k, v, mask=mask, bias=ForgetGateBias(cumulative))
        return self.out_proj(out.transpose(1, 2).flatten(2))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}"


def _count(t, s, module=None):
    b, n, dim, h, g = s["batch"], s["length"], s["dim"], s["heads"], s["kv_heads"]
    d, bn = dim // h, b * n
    t.mm("projections (q, k, v, forget gate, out)", 1, bn, dim, dim)
    t.mm("projections (q, k, v, forget gate, out)", 2, bn, dim, g * d)
    t.mm("projections (q, k, v, forget gate, out)", 1, bn, dim, h)
    t.ew("log-sigmoid and running sum of the forget gates", bn * h, 4)
    with torch.enable_grad() if t.backward else torch.no_grad():
        gates = zeros(dtype_of(s), b, h, n, requires_grad=t.backward)
        attend(t, "", b, h, n, n, d, d, hkv=g, dtype=dtype_of(s), weights_grad=t.backward, mask=masks.causal(),
               bias=ForgetGateBias(gates))
    t.mm("projections (q, k, v, forget gate, out)", 1, bn, dim, dim)
    t.io(bn * dim, 2 * dim * dim + 2 * dim * g * d + dim * h, bn * dim)
    kv_cache(t, g, d, d)
    t.decoding(per_token=h * torch.promote_types(dtype_of(s), torch.float32).itemsize)  # the running gate sum


def _make(s):
    return ForgettingAttention(s["dim"], s["heads"], num_kv_heads=s["kv_heads"]).to(dtype_of(s)).eval()


def _example():
    torch.manual_seed(0)
    return ForgettingAttention(24, 3).eval(), (randn(2, 16, 24),)


register(Entry(
    "forgetting-attention", ForgettingAttention, "Lin et al. 2025, arXiv:2503.02130, eq. 3-5 (FoX)", "O(L^2 D)",
    "causal softmax attention with a data-dependent forget-gate bias F_i - F_j (FoX)", family="module",
    example=_example,
    spec=Spec({"batch": 2, "length": 16, "dim": 24, "heads": 3, "kv_heads": None, "dtype": "float32"},
              _count, lambda s, m: (m, (randn(s["batch"], s["length"], s["dim"], dtype=dtype_of(s)),)),
              "projections 2 B L dim (2 dim + 2 g d + H); causal attention with the bias F_i - F_j, D = Dv = d",
              make=_make, length=("length",), derive=lambda s: {**s, "kv_heads": s["kv_heads"] or s["heads"]},
              config=lambda m: {"dim": m.dim, "heads": m.num_heads, "kv_heads": m.num_kv_heads},
              module_type=ForgettingAttention, nullable=frozenset({"kv_heads"}))))
