"""Sparse Transformer attention (Child et al. 2019): the "strided" and "fixed" factorized patterns."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .. import masks
from ..core import attention
from ..costing.attend import attend, projections
from ..costing.tally import dtype_of
from ..errors import ArgumentError, check_int
from ..masks.base import Mask
from ..registry.entry import Entry, register
from ._projections import ProjectedAttention, count_self_attention, projected_spec

__all__ = ["SparseTransformerAttention"]

_PATTERNS = ("strided", "fixed")


class _OtherBlockSummaries(Mask):
    """Gathered summary keys (key ``s`` belongs to block ``s // c``) outside the query's block ``i // l``.

    Earlier blocks only when causal. Exact analytic block layout: the own block's keys are
    the contiguous range ``[c (i // l), c (i // l) + c - 1]``, which grows with ``i``.
    """

    uses = frozenset({"q", "kv"})

    def __init__(self, stride: int, summary: int, causal: bool):
        self.stride, self.summary, self.causal = stride, summary, causal

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        key_block, query_block = kv_idx // self.summary, q_idx // self.stride
        return key_block < query_block if self.causal else key_block != query_block

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        def bounds(length):
            first = torch.arange(0, length, bs, device=device)
            return first, torch.clamp(first + bs - 1, max=length - 1)
        (q0, q1), (k0, k1) = bounds(q_len), bounds(kv_len)
        lo = lambda i: (self.summary * (i // self.stride))[:, None]  # first own key of each query block's row
        hi = lambda i: lo(i) + self.summary - 1
        if self.causal:
            active, full = k0 < lo(q1), k1 < lo(q0)
        else:  # the own ranges of the rows q0..q1 tile [lo(q0), hi(q1)]
            active = ~((k0 >= lo(q1)) & (k1 <= hi(q0)))
            full = (hi(q1) < k0) | (lo(q0) > k1)
        return active[None, None], full[None, None]

    def __repr__(self):
        return f"other_block_summaries(stride={self.stride}, summary={self.summary}, causal={self.causal})"


def _merge(o1, lse1, o2, lse2):
    """Softmax over the union of two disjoint key sets, from each set's output and log-sum-exp.

    ``lse1`` is finite (set 1 always holds the query itself), so no ``-inf - -inf`` arises.
    """
    lse = torch.logaddexp(lse1, lse2)
    w1, w2 = torch.exp(lse1 - lse).unsqueeze(-1), torch.exp(lse2 - lse).unsqueeze(-1)
    return (o1.to(lse.dtype) * w1 + o2.to(lse.dtype) * w2).to(o1.dtype)


class SparseTransformerAttention(ProjectedAttention):
    """Multi-head self-attention over the Sparse Transformer's "strided" or "fixed" pattern.

    Child, Gray, Radford & Sutskever 2019, arXiv:1904.10509, Sec. 4 (eq. 2-3 with the
    factorized patterns) and Sec. 5.1 ("merged head": one head attends the union
    ``S_i = A_i^(1) ∪ A_i^(2)``): ``a(x_i, S_i) = softmax(Q_i K_{S_i}^T / sqrt(d)) V_{S_i}`` with

    - strided: ``A^(1) = {j : i - l <= j <= i}``, ``A^(2) = {j : (i - j) mod l = 0}``;
    - fixed: ``A^(1) = {j : floor(j / l) = floor(i / l)}``, ``A^(2) = {j : j mod l >= l - c}``;

    all with ``j <= i`` when causal (the paper's autoregressive setting, the default; queries
    and keys are the same positions, so the causal alignment question does not arise)::

        strided, l=3, causal     fixed, l=3, c=1, causal
        x . . . . . . .          x . . . . . . .
        x x . . . . . .          x x . . . . . .
        x x x . . . . .          x x x . . . . .
        x x x x . . . .          . . x x . . . .
        . x x x x . . .          . . x x x . . .
        . . x x x x . .          . . x x x x . .
        x . . x x x x .          . . x . . x x .
        . x . . x x x x          . . x . . x x x

    Notation: ``l`` = ``stride``, ``c`` = ``summary``, ``d`` = head width, ``i``/``j`` = positions.

    Differences from the paper: ``causal=False`` gives the two-sided patterns (``|i - j| <= l``
    for strided; every block's summary positions for fixed). Only the merged head is offered
    (not one pattern per head or per layer). Computation (same function): the union is split
    into two disjoint key sets whose softmaxes are combined exactly through their log-sum-exp;
    the local set (``|i - j| < l``, or the own block) runs on the block-sparse kernel; the
    strided set on the sequence folded to ``(l, n / l)``, where positions of one residue are
    contiguous (the paper's "transpose, then attend", Sec. 5.5); the fixed set against the
    gathered ``~ n c / l`` summary keys, so no mostly-empty block is ever computed.

    Shapes:
        ``x`` ``(B, n, dim)`` -> ``(B, n, dim)``; any ``n``.

    Complexity:
        strided ``O(B H n (l + n / l) d)``, ``O(n sqrt(n))`` for ``l ~ sqrt(n)``; fixed
        ``O(B H n (l + c n / l) d)``; plus ``O(B n dim^2)`` for the projections.

    Args:
        dim: model width.
        num_heads: number of heads (``dim % num_heads == 0``).
        pattern: "strided" or "fixed".
        stride: ``l``.
        summary: ``c`` (fixed only), ``1 <= c <= l``.
        causal: keys ``j <= i`` only.
        dropout: on the weights, training only.
        bias: projections with bias.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = SparseTransformerAttention(16, 2, "fixed", stride=4, summary=1)
        >>> layer(torch.randn(2, 10, 16)).shape
        torch.Size([2, 10, 16])
    """

    def __init__(self, dim: int, num_heads: int, pattern: str = "strided", *, stride: int = 128, summary: int = 8,
                 causal: bool = True, dropout: float = 0.0, bias: bool = True):
        super().__init__(dim, num_heads, dropout=dropout, bias=bias)
        if pattern not in _PATTERNS:
            raise ArgumentError(f"SparseTransformerAttention: pattern must be one of {_PATTERNS}; got {pattern!r}")
        self.pattern, self.causal = pattern, bool(causal)
        self.stride = check_int("SparseTransformerAttention", "stride", stride, 1)
        self.summary = check_int("SparseTransformerAttention", "summary", summary, 1)
        if pattern == "fixed" and summary > stride:
            raise ArgumentError(f"SparseTransformerAttention: summary must be <= stride; got {summary} > {stride}")
        # Masks that do not depend on n are built once, so their block layouts are cached.
        not_self = ~masks.sliding_window(0, 0)
        self._band = masks.sliding_window(stride - 1, 0 if causal else stride - 1)
        self._column = masks.causal() & not_self if causal else not_self
        self._summary = _OtherBlockSummaries(stride, summary, causal)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        q, k, v = self.project(x)  # (B, H, n, D) each
        parts = self._strided(q, k, v) if self.pattern == "strided" else self._fixed(q, k, v)
        out = _merge(*parts[0], *parts[1]) if len(parts) == 2 else parts[0][0]
        return self.merge_heads(out)

    def _attend(self, q, k, v, mask):
        result = attention(q, k, v, mask=mask, dropout_p=self.dropout_p, return_lse=True)
        return result.output, result.lse

    def _strided(self, q, k, v):
        """``[(out, lse)]`` of the band ``|i - j| < l`` and of the strided keys ``j = i - t l, t != 0``."""
        local = self._attend(q, k, v, self._band)
        batch, heads, n, d = q.shape
        l, m = self.stride, -(-n // self.stride)
        if m < 2:  # no position has a strided key other than itself
            return [local]
        fold = lambda t: F.pad(t, (0, 0, 0, m * l - n)).view(batch, heads, m, l, d).permute(0, 3, 1, 2, 4).reshape(
            batch * l, heads, m, d)  # (B * l, H, m, d): row r holds positions r, r + l, r + 2l, ...
        mask = self._column
        if not self.causal and m * l != n:  # causal queries never reach the padding; two-sided ones would
            real = (n - torch.arange(l, device=q.device) + l - 1) // l  # positions of each residue
            mask = mask & masks.padding(real.repeat(batch))
        out, lse = self._attend(fold(q), fold(k), fold(v), mask)
        out = out.view(batch, l, heads, m, d).permute(0, 2, 3, 1, 4).reshape(batch, heads, m * l, d)[:, :, :n]
        lse = lse.view(batch, l, heads, m).permute(0, 2, 3, 1).reshape(batch, heads, m * l)[:, :, :n]
        return [local, (out, lse)]

    def _fixed(self, q, k, v):
        """``[(out, lse)]`` of the own block and of the summary keys of the other blocks."""
        n = q.shape[2]
        pos = torch.arange(n, device=q.device)
        own = masks.segments(pos // self.stride)
        local = self._attend(q, k, v, own & masks.causal() if self.causal else own)
        keys = pos[pos % self.stride >= self.stride - self.summary]  # the summary positions, in order
        if not (keys.numel() and n > self.stride):
            return [local]
        return [local, self._attend(q, k.index_select(2, keys), v.index_select(2, keys), self._summary)]

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, pattern={self.pattern!r}, stride={self.stride}, "
                f"summary={self.summary}, causal={self.causal}")


def _example():
    g = torch.Generator().manual_seed(0)
    return SparseTransformerAttention(16, 2, "strided", stride=4), (torch.randn(2, 18, 16, generator=g),)


def _count(t, s, module):
    b, n, h = s["batch"], s["length"], s["heads"]
    hd = s["dim"] // h
    projections(t, s)
    if module.pattern == "strided":
        count_self_attention(t, "band: ", s, module, module._band, return_lse=True)
        l, m = module.stride, -(-n // module.stride)
        if m >= 2:
            mask = module._column
            if not module.causal and m * l != n:
                mask = mask & masks.padding(((n - torch.arange(l) + l - 1) // l).repeat(b))
            attend(t, "strided keys: ", b * l, h, m, m, hd, hd, dtype=dtype_of(s), mask=mask, return_lse=True,
                   dropout_p=module.dropout_p)
    else:
        own = masks.segments(torch.arange(n) // module.stride)
        count_self_attention(t, "own block: ", s, module, own & masks.causal() if module.causal else own,
                             return_lse=True)
        l, c = module.stride, module.summary
        summary = n // l * c + max(0, n % l - (l - c))  # positions p with p % l >= l - c
        if summary and n > l:
            attend(t, "summary keys: ", b, h, n, summary, hd, hd, dtype=dtype_of(s), mask=module._summary,
                   return_lse=True, dropout_p=module.dropout_p)
    t.ew("merge of the two softmaxes", b * h * n * (hd + 4), 3)


def _derive(s):
    s["stride"] = math.isqrt(max(s["length"], 1)) if s["stride"] is None else s["stride"]
    s["summary"] = max(1, s["stride"] // 4) if s["summary"] is None else s["summary"]
    return s


_SETTINGS = ("pattern", "stride", "summary", "causal")
register(Entry("sparse-transformer", SparseTransformerAttention,
               "Child et al. 2019, arXiv:1904.10509, Sec. 4 and 5.1", "O(L sqrt(L) D)",
               "strided or fixed factorized pattern, merged head, causal by default",
               "long-sequence", _example,
               spec=projected_spec(
                   SparseTransformerAttention, _count, "local set (band or own block) + strided set (folded to "
                   "(l, n/l)) or summary keys, each as the dispatcher runs it", options=_SETTINGS, derive=_derive,
                   sizes={"length": 18, "pattern": "strided", "stride": None, "summary": None, "causal": True})))
