"""Slabs of query blocks for the band path (:mod:`.band`): views of Q, K, V, never gathers.

Tensors are ``(N, G, Lq, .)`` for queries (``N = B * H_kv`` key/value heads, ``G``
query heads per key/value head) and ``(N, Lk, .)`` for keys and values. A slab is
a batch of query blocks that one ``bmm`` computes against their key windows:

- a run of interior blocks of one head: windows are one ``as_strided`` view of K;
- one interior block of a run of heads: windows are a slice of K;
- one edge block (window past either end of the keys, or rows past ``Lq``) of a run
  of heads: zero-padded copies and the block's exact mask.

Interior blocks share one mask, the band, whose masked entries sit in the two
``(bs, bs)`` corners of the ``(bs, W)`` window; every interior row has a key.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

SLAB = 1 << 21  # score elements per slab (8 MiB in float32): few, large ops per call


class Plan(NamedTuple):
    """Block size, band ``lo <= j - i <= hi``, window width ``W``, interior blocks ``[interior_first, stop)``."""

    bs: int
    lo: int
    hi: int
    width: int
    lq: int
    lk: int
    nq: int
    interior_first: int
    interior_stop: int  # the interior blocks are [interior_first, interior_stop)


def make_plan(bs: int, lo: int, hi: int, lq: int, lk: int) -> Plan:
    nq, width = -(-lq // bs), bs + hi - lo
    interior_first = min(nq, max(0, -(lo // bs)))  # blocks whose window starts before key 0
    last_inside = min((lk - lo - width) // bs, lq // bs - 1)  # window ends inside the keys, every row < Lq
    return Plan(bs, lo, hi, width, lq, lk, nq, interior_first, max(interior_first, min(nq, last_inside + 1)))


def _strided_rows(t: torch.Tensor, first: int, count: int, length: int, step: int) -> torch.Tensor:
    """``count`` row windows of a row-major ``(L, E)`` tensor: rows ``first + c*step ..``, ``(count, length, E)``."""
    e = t.shape[-1]
    return t.as_strided((count, length, e), (step * e, e, 1), t.storage_offset() + first * e)


def _padded_rows(t: torch.Tensor, first: int, length: int) -> torch.Tensor:
    """Rows ``first .. first + length - 1`` of ``(n, L, E)``, a view when all exist, else zero-padded."""
    if first >= 0 and first + length <= t.shape[1]:
        return t[:, first:first + length]
    out = t.new_zeros(t.shape[0], length, t.shape[2])
    lo, hi = max(0, first), min(t.shape[1], first + length)
    if hi > lo:
        out[:, lo - first:hi - first] = t[:, lo:hi]
    return out


class Slab:
    """Blocks ``i`` (``[i0, i1)`` of head ``n0``, or block ``i0`` of heads ``[n0, n1)``) of query group ``g``."""

    def __init__(self, pl: Plan, g: int, n0: int, n1: int, i0: int, i1: int, tensors, edge_mask=None):
        q, k, v, out, lse, dout, delta = tensors
        self.pl, self.g, self.n0, self.n1, self.i0, self.i1 = pl, g, n0, n1, i0, i1
        self.edge_mask, self.out_t, self.lse_t = edge_mask, out[:, g], (lse[:, g] if lse is not None else None)
        self.run = n1 - n0 == 1 and edge_mask is None
        self.rows = min(pl.bs, pl.lq - i0 * pl.bs)  # real rows of the (last) block
        self.q = self._query_rows(q[:, g])
        self.k, self.v = (self._window(t) for t in (k, v))
        self.dout = self._query_rows(dout[:, g]) if dout is not None else None
        self.delta = self._query_rows(delta[:, g, :, None])[..., 0] if delta is not None else None
        if edge_mask is not None:
            self.empty_rows = edge_mask.all(-1, keepdim=True)  # (bs, 1)
            self.has_empty = bool(self.empty_rows.any())

    def _query_rows(self, t):
        pl = self.pl
        if self.run:
            return _strided_rows(t[self.n0], self.i0 * pl.bs, self.i1 - self.i0, pl.bs, pl.bs)
        return _padded_rows(t[self.n0:self.n1], self.i0 * pl.bs, pl.bs)

    def _window(self, t):
        pl = self.pl
        if self.run:
            return _strided_rows(t[self.n0], self.i0 * pl.bs + pl.lo, self.i1 - self.i0, pl.width, pl.bs)
        return _padded_rows(t[self.n0:self.n1], self.i0 * pl.bs + pl.lo, pl.width)

    def mask_(self, s: torch.Tensor, value: float) -> None:
        """Fill the masked entries of scores ``(n, bs, W)`` in place."""
        if self.edge_mask is not None:
            s.masked_fill_(self.edge_mask, value)
            return
        bs = self.pl.bs
        left, right = _corners(bs, s.device)
        s[:, :, :bs].masked_fill_(left, value)  # keys before the row's first
        s[:, :, -bs:].masked_fill_(right, value)  # keys after the row's last

    def zero_empty_rows_(self, probs: torch.Tensor) -> None:
        if self.edge_mask is not None and self.has_empty:
            probs.masked_fill_(self.empty_rows, 0.0)

    def fill_empty_rows(self, t: torch.Tensor, value: float) -> torch.Tensor:
        return t.masked_fill(self.empty_rows[:, 0], value) if self.edge_mask is not None and self.has_empty else t

    def out_buffer(self, work):
        """Where a bmm writes this slab's rows: in place for a run, else a workspace buffer for :meth:`write_out`."""
        if self.run:
            return self._query_rows(self.out_t)
        return work.take("o", self.n1 - self.n0, self.pl.bs, self.out_t.shape[-1])

    def write_out(self, res: torch.Tensor) -> None:
        if not self.run:
            start = self.i0 * self.pl.bs
            self.out_t[self.n0:self.n1, start:start + self.rows] = res[:, :self.rows]

    def write_lse(self, t: torch.Tensor) -> None:
        start = self.i0 * self.pl.bs
        if self.run:
            self.lse_t[self.n0, start:start + t.numel()] = t.reshape(-1)
        else:
            self.lse_t[self.n0:self.n1, start:start + self.rows] = t[:, :self.rows]

    def add_window(self, dst: torch.Tensor, part: torch.Tensor) -> None:
        """Add window gradients ``part (n, W, E)`` into the key rows ``dst (N, Lk, E)`` they were read from."""
        pl = self.pl
        first = self.i0 * pl.bs + pl.lo
        if not self.run:
            lo, hi = max(0, first), min(pl.lk, first + pl.width)
            if hi > lo:
                dst[self.n0:self.n1, lo:hi] += part[:, lo - first:hi - first]
            return
        for t in range(0, pl.width, pl.bs):  # windows overlap: add them a block-wide strip at a time
            c = min(pl.bs, pl.width - t)
            _strided_rows(dst[self.n0], first + t, part.shape[0], c, pl.bs).add_(part[:, t:t + c])


_CORNERS: dict = {}


def _corners(bs: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    key = (bs, str(device))
    if key not in _CORNERS:
        r = torch.arange(bs, device=device)
        _CORNERS[key] = (r[None, :] < r[:, None], r[None, :] > r[:, None])  # strictly lower / upper triangle
    return _CORNERS[key]


def _edge_mask(pl: Plan, block: int, device) -> torch.Tensor:
    """Exact ``(bs, W)`` mask (True = masked) of one block."""
    i = block * pl.bs + torch.arange(pl.bs, device=device)[:, None]
    j = block * pl.bs + pl.lo + torch.arange(pl.width, device=device)[None, :]
    return ~((j - i >= pl.lo) & (j - i <= pl.hi) & (j >= 0) & (j < pl.lk) & (i < pl.lq))


def slabs(q, k, v, pl: Plan, out, lse=None, dout=None, delta=None):
    """Every slab of every query group; interior runs go per head or per block, whichever makes fewer calls."""
    n_heads, groups = q.shape[:2]
    step = max(1, SLAB // (pl.bs * pl.width))
    interior = pl.interior_stop - pl.interior_first
    per_head = n_heads * -(-interior // step) <= interior * -(-n_heads // step)
    edges = {i: _edge_mask(pl, i, q.device) for i in range(pl.nq) if not pl.interior_first <= i < pl.interior_stop}
    tensors = (q, k, v, out, lse, dout, delta)
    for g in range(groups):
        if per_head:
            for n in range(n_heads):
                for i0 in range(pl.interior_first, pl.interior_stop, step):
                    yield Slab(pl, g, n, n + 1, i0, min(pl.interior_stop, i0 + step), tensors)
        else:
            for i in range(pl.interior_first, pl.interior_stop):
                for n0 in range(0, n_heads, step):
                    yield Slab(pl, g, n0, min(n_heads, n0 + step), i, i + 1, tensors)
        for i, mask in edges.items():
            for n0 in range(0, n_heads, step):
                yield Slab(pl, g, n0, min(n_heads, n0 + step), i, i + 1, tensors, mask)
