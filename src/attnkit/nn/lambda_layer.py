"""Lambda layer: summarise the context into small linear functions applied to each query (Bello 2021)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..costing.spec import Spec
from ..costing.tally import dtype_of
from ..errors import ArgumentError, ShapeError, check_int
from ..registry.entry import Entry, register
from ._inputs import check_sequence, merge_heads, split_heads
from ._projections import sequence_input

__all__ = ["LambdaLayer"]


class LambdaLayer(nn.Module):
    """Lambda layer with content and position lambdas (Bello 2021, arXiv:2102.08602, Sec. 3 and 4.3).

    With ``Q = X W_Q`` (``|h|`` query heads of size ``|k|``), ``K = softmax_m(X W_K)`` (normalised over the
    context positions m) and ``V = X W_V`` (``|v| = dim_out / |h|``)::

        lambda^c = K^T V                 (|k| x |v|, shared by every query)
        lambda^p_n = E_n^T V             (E_nm = R[m - n], relative position embeddings)
        y_n = concat_h((lambda^c + lambda^p_n)^T q_n^h)

    Multi-query heads: the ``|h|`` heads share one lambda, so the cost does not grow with ``|h|``. Global
    context (``max_len``): m ranges over the whole sequence, R has ``2 max_len - 1`` rows. Local context
    (``local_context=r``): m within ``n +- r // 2`` (zero padded at the ends), and the position lambdas
    are a 1-D convolution of V with the ``r`` embeddings (the paper's lambda convolution, Sec. 4.3).
    Notation: R = ``rel_pos`` ``(offsets, |k|)``, W_Q, W_K, W_V = ``q_proj, k_proj, v_proj``.

    Differences from the paper: no batch normalisation of queries and values (apply your own
    normalisation around the layer); the context is the input itself (m = n); 1-D sequences only.

    Shapes: ``x`` ``(b, n, dim)`` -> ``(b, n, dim_out)``; global context needs ``n <= max_len``.

    Complexity: content ``O(n |k| |v|)``; position lambdas ``O(n m |k| |v|)`` global (as
    ``O(n m (|k| + |v|))`` via relative logits) or ``O(n r |k| |v|)`` local. Memory ``O(n m)`` global,
    ``O(n |k| |v|)`` local.

    Args:
        dim: input width.
        key_dim: query/key depth ``|k|``.
        num_heads: query heads ``|h|``.
        dim_out: output width (default ``dim``; divisible by ``num_heads``).
        max_len: global context for sequences up to this length.
        local_context: odd scope size r of a local context (give exactly one of the two).

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = LambdaLayer(32, key_dim=8, num_heads=4, local_context=5)
        >>> layer(torch.randn(2, 30, 32)).shape
        torch.Size([2, 30, 32])
    """

    def __init__(self, dim: int, *, key_dim: int = 16, num_heads: int = 4, dim_out: int | None = None,
                 max_len: int | None = None, local_context: int | None = None):
        super().__init__()
        dim_out = dim_out or dim
        if num_heads < 1 or dim_out % num_heads:
            raise ArgumentError(f"dim_out ({dim_out}) must be divisible by num_heads ({num_heads})")
        if (max_len is None) == (local_context is None):
            raise ArgumentError("give exactly one of max_len (global context) or local_context (scope size r)")
        if local_context is not None and (local_context < 1 or local_context % 2 == 0):
            raise ArgumentError(f"local_context must be an odd int >= 1; got {local_context}")
        check_int("LambdaLayer", "key_dim", key_dim, 1)
        if max_len is not None and max_len < 1:
            raise ArgumentError(f"max_len must be >= 1; got {max_len}")
        self.dim, self.key_dim, self.num_heads, self.value_dim = dim, key_dim, num_heads, dim_out // num_heads
        self.max_len, self.local_context = max_len, local_context
        self.q_proj = nn.Linear(dim, key_dim * num_heads, bias=False)
        self.k_proj = nn.Linear(dim, key_dim, bias=False)
        self.v_proj = nn.Linear(dim, self.value_dim, bias=False)
        offsets = 2 * max_len - 1 if max_len is not None else local_context
        self.rel_pos = nn.Parameter(torch.randn(offsets, key_dim) * key_dim ** -0.5)  # row o: offset m - n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_sequence("LambdaLayer", "x", x, self.dim, like=self)
        n = x.shape[1]
        if self.max_len is not None and n > self.max_len:
            raise ShapeError(f"x has length {n} but this LambdaLayer's global context has max_len={self.max_len}")
        if n == 0:
            return self.v_proj(x).repeat(1, 1, self.num_heads)  # (b, 0, dim_out), still part of the graph
        q = split_heads(self.q_proj(x), self.num_heads)  # (b, h, n, k)
        keys = torch.softmax(self.k_proj(x), dim=1)  # (b, m, k): normalised over context positions
        v = self.v_proj(x)  # (b, m, v)
        content = keys.transpose(1, 2) @ v  # (b, k, v)
        y = q @ content.unsqueeze(1)  # (b, h, n, v)
        y = y + (self._global(q, v) if self.local_context is None else self._local(q, v))
        return merge_heads(y)

    def _global(self, q, v):
        """``sum_m (q_n . R[m - n]) v_m`` through relative logits, never an (n, m, k) tensor."""
        n = q.shape[2]
        rel = self.rel_pos[self.max_len - n: self.max_len + n - 1].to(q.dtype)  # offsets -(n-1) .. n-1
        logits = q @ rel.T  # (b, h, n, 2n-1)
        idx = torch.arange(n, device=q.device)
        gather = (idx.view(1, -1) - idx.view(-1, 1) + n - 1).expand(*q.shape[:2], n, n)  # [n, m] -> m - n
        return torch.gather(logits, 3, gather) @ v.unsqueeze(1)  # (b, h, n, m) @ (b, 1, m, v)

    def _local(self, q, v):
        """Position lambdas as a 1-D convolution over positions, one channel per value dimension."""
        b, m, dv = v.shape
        r = self.local_context
        weight = self.rel_pos.to(v.dtype).T.unsqueeze(1)  # (k, 1, r): tap t is offset t - r // 2
        lam = F.conv1d(v.transpose(1, 2).reshape(b * dv, 1, m), weight, padding=r // 2)  # (b*v, k, n)
        lam = lam.view(b, dv, self.key_dim, m).permute(0, 3, 2, 1)  # (b, n, k, v)
        return torch.einsum("bhnk,bnkv->bhnv", q, lam)


def _example(**kwargs):
    def build():
        g = torch.Generator().manual_seed(0)
        return LambdaLayer(32, key_dim=8, num_heads=4, **kwargs), (torch.randn(2, 16, 32, generator=g),)
    return build


def _count(t, s, module=None):
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


def _spec(local):
    return Spec({"batch": 2, "length": 16, "dim": 32, "heads": 4, "dtype": "float32", "key_dim": 8, "dim_out": None,
                 "max_len": None, "local_context": local}, _count, sequence_input,
                "projections 2 B n dim (k h + k + v); content 2 B k n v + 2 B h n k v; " + (
                    "positions 2 B h n k (2n - 1) + 2 B h n^2 v" if local is None else
                    "positions conv 2 B v k n r + 2 B h n k v"),
                make=lambda s: LambdaLayer(s["dim"], key_dim=s["key_dim"], num_heads=s["heads"], dim_out=s["dim_out"],
                                           max_len=None if s["local_context"] else s["max_len"] or s["length"],
                                           local_context=s["local_context"]).to(dtype_of(s)),
                module_type=LambdaLayer, matches=lambda m: (m.local_context is None) == (local is None),
                config=lambda m: {"dim": m.dim, "key_dim": m.key_dim, "heads": m.num_heads,
                                  "dim_out": m.value_dim * m.num_heads, "local_context": m.local_context,
                                  "max_len": m.max_len})


_PAPER = "Bello 2021, arXiv:2102.08602, Sec. 3"
register(Entry("lambda-layer", LambdaLayer, _PAPER, "O(L^2 (k + v))", "content + global relative-position lambdas "
               "applied to multi-query heads", "long-sequence", _example(max_len=16), spec=_spec(None)))
register(Entry("lambda-layer-local", LambdaLayer, _PAPER + " and 4.3", "O(L r k v)",
               "content lambda + local position lambdas by a 1-D convolution", "long-sequence",
               _example(local_context=5), spec=_spec(5)))
