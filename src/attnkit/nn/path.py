"""The PaTH attention layer: causal softmax attention whose keys are moved by each later token's reflection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core import attention
from ..costing.attend import kv_cache
from ..costing.spec import Spec
from ..costing.tally import dtype_of, randn
from ..errors import ShapeError, check_int
from ..functional.forgetting import ForgetGateBias
from ..functional.path import choose_form, path_attention
from ..registry.entry import Entry, register
from .forgetting import ForgetCache
from .kv_cache import check_step

__all__ = ["PaTHAttention", "PathCache"]


class PathCache(ForgetCache):
    """A :class:`ForgetCache` whose keys are stored as the next query reads them: ``k~_j = H_t ... H_{j+1} k_j``.

    :meth:`reflect` applies a new token's ``H_t = I - beta_t w_t w_t^T`` to every stored key; the
    token's own key is then appended as it is (``H`` of later tokens will move it).
    """

    def reflect(self, w: torch.Tensor, beta: torch.Tensor) -> None:
        """``w`` ``(B, Hkv, D)``, ``beta`` ``(B, Hkv)``: ``k~ <- k~ - beta (k~ . w) w`` for every stored key."""
        n = len(self)
        if n == 0:
            return
        keys = self._k[:, :, :n]
        moved = keys - beta[..., None, None] * (keys @ w[..., :, None]) * w[..., None, :]
        if torch.is_grad_enabled() and (moved.requires_grad or self._k.requires_grad):
            self._k = torch.cat([moved, self._k[:, :, n:]], 2)  # earlier steps' graphs keep the keys they read
        else:
            self._k[:, :, :n] = moved


class PaTHAttention(nn.Module):
    """PaTH attention: positions as accumulated, data-dependent Householder-like transformations of the keys.

    Yang et al. 2025, "PaTH Attention: Position Encoding via Accumulating Householder
    Transformations", arXiv:2505.16381::

        q, k, v = x W_Q, x W_K, x W_V;   w_t = l2norm(x_t W_w);   beta_t = 2 sigmoid(x_t W_beta + b_beta)
        s_ij = q_i^T H_i ... H_{j+1} k_j,  H_t = I - beta_t w_t w_t^T     (per key head)
        o_i = sum_{j <= i} softmax_j(s_ij / sqrt(d) + F_i - F_j) v_j;   y = o W_O

    with FoX's forget gate ``F`` (running sums of ``log sigmoid(x W_f + b_f)``, per query head) when
    ``forget_gate`` (PaTH-FoX), :func:`attnkit.functional.path.path_attention` without a cache.
    Decoding (:meth:`new_cache`) keeps each key as the next query reads it and reflects the stored
    keys by every new token's ``H_t``: O(n d) per token and head. Notation: ``W_Q, W_K, W_V, W_w,
    W_beta, W_f, W_O`` = ``q_proj, k_proj, v_proj, w_proj, beta_proj, fgate_proj, out_proj``.

    Differences from the paper: no short convolution on ``w`` (the reference layer's option); no
    QK-norm. The forget-gate bias is not scaled with the scores (flash-linear-attention's reference
    scales it by ``1/sqrt(d)``).

    Shapes: ``x`` ``(B, t, dim)`` -> ``(B, t, dim)``; with ``cache`` the ``t`` tokens follow the
    cached ones (run one at a time).

    Complexity: without a cache, ``form="parallel"`` O(L^2 dim + H L^3) time and O(H L^2) memory
    (the parallel form's triangular solve); ``form="chunk"`` O(L^2 dim + H L c (c + d)) time and
    O(H L (c + d)) memory, forward and backward (blocks of ``c = chunk_size``); decoding O(n dim) per
    token, a cache of ``2 Hkv d`` numbers per token (and ``H`` gate sums with the forget gate).

    Args:
        dim: model width.
        num_heads: query heads H (``dim % H == 0``).
        num_kv_heads: key/value heads, each with its own transformations (H a multiple; default H).
        forget_gate: add FoX's forget gate (PaTH-FoX).
        form: ``"auto"`` (default), ``"parallel"`` or ``"chunk"``, the form of
            :func:`~attnkit.functional.path.path_attention` used without a cache (equal up to rounding);
            ``"auto"`` runs the chunk form from 192 tokens on (faster there, forward and backward:
            0.79x the parallel form's time at 192, 0.24x at 1024), the parallel form below.
        chunk_size: the chunk form's block length.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = PaTHAttention(16, 4, num_kv_heads=2)
        >>> x = torch.randn(2, 7, 16)
        >>> cache = layer.new_cache(2, 7)
        >>> steps = torch.cat([layer(x[:, :3], cache=cache), layer(x[:, 3:], cache=cache)], 1)
        >>> torch.allclose(steps, layer(x), atol=1e-5)
        True
    """

    def __init__(self, dim: int, num_heads: int, *, num_kv_heads: int | None = None, forget_gate: bool = False,
                 form: str = "auto", chunk_size: int = 64):
        super().__init__()
        who = "PaTHAttention"
        choose_form(who, form, 0)
        self.form, self.chunk_size = form, check_int(who, "chunk_size", chunk_size, 1)
        heads, kv = check_int(who, "num_heads", num_heads, 1), num_kv_heads or num_heads
        if check_int(who, "dim", dim, 1) % heads or heads % check_int(who, "num_kv_heads", kv, 1):
            raise ShapeError(f"{who}: dim must be a multiple of num_heads and num_heads of num_kv_heads; got "
                             f"dim={dim}, num_heads={heads}, num_kv_heads={kv}")
        self.dim, self.num_heads, self.num_kv_heads, self.head_dim = dim, heads, kv, dim // heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj, self.v_proj, self.w_proj = (nn.Linear(dim, kv * self.head_dim, bias=False) for _ in range(3))
        self.beta_proj = nn.Linear(dim, kv)
        self.fgate_proj = nn.Linear(dim, heads) if forget_gate else None
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def new_cache(self, batch: int, max_len: int, *, dtype=None, device=None) -> PathCache:
        """An empty :class:`PathCache` for ``batch`` sequences of at most ``max_len`` positions."""
        w = self.out_proj.weight
        return PathCache(batch, max_len, self.num_kv_heads, self.head_dim, self.num_heads, dtype=dtype or w.dtype,
                         device=device or w.device)

    def _heads(self, t, heads):
        return t.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)  # (B, t, heads d) -> (B, heads, t, d)

    def forward(self, x: torch.Tensor, *, cache: PathCache | None = None) -> torch.Tensor:
        x, _ = check_step(type(self).__name__, self, x, self.dim, None, cache, kind=PathCache)
        hk = self.num_kv_heads
        q, k, v = self._heads(self.q_proj(x), self.num_heads), self._heads(self.k_proj(x), hk), self._heads(
            self.v_proj(x), hk)
        w = F.normalize(self._heads(self.w_proj(x), hk), dim=-1, eps=1e-6)
        beta = 2 * torch.sigmoid(self.beta_proj(x)).transpose(1, 2)  # (B, Hkv, t): in [0, 2]
        log_f = None if self.fgate_proj is None else F.logsigmoid(self.fgate_proj(x)).transpose(1, 2)
        if cache is None:
            out = path_attention(q, k, v, w, beta, log_fgate=log_f, form=self.form, chunk_size=self.chunk_size)
        else:
            out = torch.cat([self._step(cache, q, k, v, w, beta, log_f, t) for t in range(x.shape[1])], 2)
        return self.out_proj(out.transpose(1, 2).flatten(2))

    def _step(self, cache: PathCache, q, k, v, w, beta, log_f, t: int) -> torch.Tensor:
        """Token ``t`` of the call: reflect the stored keys by its ``H_t``, store its key, attend; ``(B, H, 1, d)``."""
        cache.reflect(w[:, :, t], beta[:, :, t])
        gates = log_f[:, :, t:t + 1] if log_f is not None else q.new_zeros(q.shape[0], q.shape[1], 1)
        cumulative = cache.append_gates(gates)
        keys, values = cache.append(k[:, :, t:t + 1], v[:, :, t:t + 1])
        bias = None if log_f is None else ForgetGateBias(cumulative)
        return attention(q[:, :, t:t + 1], keys, values, bias=bias)  # the last position sees every stored key

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"forget_gate={self.fgate_proj is not None}, form={self.form!r}, chunk_size={self.chunk_size}")


def _count(t, s, module=None):
    b, n, dim, h, g = s["batch"], s["length"], s["dim"], s["heads"], s["kv_heads"]
    d, bn, bh = dim // h, b * n, b * h
    t.mm("projections (q, k, v, w, beta, forget gate, out)", 1, bn, dim, dim)
    t.mm("projections (q, k, v, w, beta, forget gate, out)", 3, bn, dim, g * d)
    t.mm("projections (q, k, v, w, beta, forget gate, out)", 1, bn, dim, g)
    if s["forget_gate"]:
        t.mm("projections (q, k, v, w, beta, forget gate, out)", 1, bn, dim, h)
    if choose_form("cost('path-attention')", s["form"], n) == "chunk":
        _count_chunk(t, b, h, g, n, d, s["chunk_size"])
    else:
        t.mm("PaTH scores: q k^T, q w^T, (beta w) w^T, (beta w) k^T", 4 * bh, n, d, n)
        t.mm("PaTH scores: tril(q w^T) T^-1 (beta w k^T)", bh, n, n, n)
        if t.backward:  # the triangular solve is counted by no counter; its backward forms one product
            t.fused("PaTH scores: the triangular solve's backward product", 0, 2 * bh * n * n * n)
        t.mm("weights @ v", bh, n, n, d)
        t.ew("normalisation, gates, softmax (elementwise)", bh * n * n, 8)
        t.inter(5 * bh * n * n)
    t.mm("projections (q, k, v, w, beta, forget gate, out)", 1, bn, dim, dim)
    t.io(bn * dim, 2 * dim * dim + 3 * dim * g * d + dim * g + s["forget_gate"] * dim * h, bn * dim)
    kv_cache(t, g, d, d)
    t.decoding(per_token=h * torch.promote_types(dtype_of(s), torch.float32).itemsize)  # the gate sums


def _count_chunk(t, b, h, g, n, d, c):
    """The chunk form: ``nb`` blocks of ``c`` (the last padded); each query block's walk recomputed in the backward."""
    nb = -(-n // check_int("cost('path-attention')", "chunk_size", c, 1))
    kb, qb, pairs = b * g * nb, b * h * nb, nb * (nb - 1) // 2
    t.mm("blocks: (beta w) w^T, (beta w) k^T, keys to the block's end Y^T w", 2 * kb, c, d, c)
    t.mm("blocks: (beta w) w^T, (beta w) k^T, keys to the block's end Y^T w", kb, c, c, d,
         grads=2 if nb > 1 else 0)  # one block: the moved keys meet no later query
    if t.backward:  # the triangular solve [M, Y] = T^-1 [beta W, tril_-1(beta W K^T)]: its backward forms one product
        t.fused("blocks: the triangular solve's backward product", 0, 2 * kb * c * c * (d + c))
    t.mm("queries to the block's start and diagonal blocks: q w^T, q k^T, tril(q w^T) M", 2 * qb, c, d, c)
    t.mm("queries to the block's start and diagonal blocks: q w^T, q k^T, tril(q w^T) M", qb, c, c, d,
         grads=2 if nb > 1 else 0)  # one block: the moved queries meet no earlier key
    t.mm("queries to the block's start and diagonal blocks: tril(q w^T) Y", qb, c, c, c)
    t.mm("earlier key blocks' scores (recomputed in the backward)", b * h * pairs, c, d, c, recompute=True)
    t.mm("weights @ v (recomputed in the backward)", b * h * (pairs + nb), c, c, d, recompute=True)
    t.mm("queries moved back through a block: (q w^T) M (recomputed in the backward)",
         2 * b * h * max(0, (nb - 1) * (nb - 2) // 2), c, d, c, recompute=True)
    t.ew("normalisation, gates, online softmax (elementwise)", b * h * c * c * (pairs + nb), 10)
    t.inter(b * h * nb * c * (2 * c + 2 * d), b * g * nb * c * (3 * c + 3 * d))


def _make(s):
    return PaTHAttention(s["dim"], s["heads"], num_kv_heads=s["kv_heads"], forget_gate=s["forget_gate"],
                         form=s["form"], chunk_size=s["chunk_size"]).to(dtype_of(s)).eval()


def _example():
    torch.manual_seed(0)
    return PaTHAttention(24, 3).eval(), (randn(2, 16, 24),)


register(Entry(
    "path-attention", PaTHAttention, "Yang et al. 2025, arXiv:2505.16381 (PaTH; PaTH-FoX with forget_gate)",
    "O(L^2 D + H L^3)", "causal softmax attention whose keys are moved by accumulated data-dependent Householder "
    "transformations", family="module", example=_example,
    spec=Spec({"batch": 2, "length": 16, "dim": 24, "heads": 3, "kv_heads": None, "forget_gate": False,
               "form": "auto", "chunk_size": 64, "dtype": "float32"},
              _count, lambda s, m: (m, (randn(s["batch"], s["length"], s["dim"], dtype=dtype_of(s)),)),
              "projections 2 B L dim (2 dim + 3 g d + g (+ H)); per head 2 L^2 d (4 + 1) + 2 L^3 (the scores' "
              "triangular system; its backward one more product); chunk form (blocks of c): per head 2 L^2 d "
              "(about 3/2 + 1/2, the walk recomputed in the backward) + 2 L c (4 d + c)",
              make=_make, length=("length",), derive=lambda s: {**s, "kv_heads": s["kv_heads"] or s["heads"]},
              config=lambda m: {"dim": m.dim, "heads": m.num_heads, "kv_heads": m.num_kv_heads,
                                "forget_gate": m.fgate_proj is not None, "form": m.form, "chunk_size": m.chunk_size},
              module_type=PaTHAttention, nullable=frozenset({"kv_heads"}))))
