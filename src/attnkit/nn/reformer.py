"""Reformer LSH attention: hash shared query-keys into buckets, sort, attend within chunks (Kitaev et al. 2020)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core import attention
from ..costing.attend import attend, projections
from ..costing.spec import Spec
from ..costing.tally import dropout_of, dtype_of, ones, zeros
from ..errors import ArgumentError, ShapeError
from ..registry.entry import Entry, register
from ._inputs import check_keep_mask, check_sequence, merge_heads, split_heads
from ._projections import sequence_input
from .padding import clear_padding

__all__ = ["LSHAttention", "ReformerAttention", "bucket_order"]


def bucket_order(buckets: torch.Tensor) -> torch.Tensor:
    """Positions sorted by ``(bucket, position)``: ties between equal buckets broken by position."""
    n = buckets.shape[-1]
    key = buckets * n + torch.arange(n, device=buckets.device)  # unique keys: the order is fully determined
    return torch.argsort(key, dim=-1, stable=True)


def _look_back(t: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.roll(1, dims=3), t], dim=4)  # (b,h,R,C,c,...) -> (b,h,R,C,2c,...): previous, own


class LSHAttention(nn.Module):
    """Multi-round LSH attention with shared query-keys (Kitaev et al. 2020, arXiv:2001.04451, Sec. 2).

    Keys are the normalised queries, ``k_j = q_j / |q_j|``. Round r hashes ``h_r(x) = argmax([x R_r;
    -x R_r])`` with a random rotation ``R_r`` (d x n_buckets/2); positions are sorted by (bucket,
    position) and cut into chunks of ``chunk_size``; a query attends to the keys of its own and the
    previous chunk that share its bucket ("LSH attention"), never to itself while another key is
    available ("Causal masking for shared-QK attention"), and with ``causal`` only to earlier
    positions. Rounds are combined by their log-sum-exp ("Multi-round LSH attention"):
    ``o_i = sum_r exp(z_r(i) - z(i)) o_r(i)``, each round's scores carrying ``-log N_ij`` with ``N_ij``
    the number of rounds in which i and j share a bucket, so a pair found twice counts once.

    Differences from the paper: the self-exclusion is exact (a token attends to itself only if no
    other key is available in any round: then its output is its own value) instead of a 1e5 penalty;
    chunk 0 has no previous chunk (no wrap-around); the rotations are the buffer ``rotations``, drawn
    from ``seed`` and redrawn only by :meth:`redraw` (from an explicit generator), so a recomputation
    (checkpointing, reversible layers) sees the same buckets. ``n_buckets=1`` puts every token in one
    bucket. As in the paper, with several chunks which earlier keys share a query's window can depend
    on later tokens' buckets (no gradient or value flows from a later position into an earlier one).

    Shapes: ``qk`` ``(b, h, n, d)``, ``v`` ``(b, h, n, dv)``, ``key_keep_mask`` ``(b, n)`` bool (True =
    real token) -> ``(b, h, n, dv)``.

    Complexity: O(R n c (d + dv)) time and O(R n c) memory for R rounds and chunk c, plus the sort.

    Args:
        head_dim: d.
        n_buckets: 1 or an even number of buckets.
        n_hashes: rounds R.
        chunk_size: c.
        causal: attend only to earlier positions.
        dropout: on the weights while training.
        seed: seed of the first rotations.

    Example:
        >>> import torch
        >>> lsh = LSHAttention(8, n_buckets=4, n_hashes=2, chunk_size=4, seed=0)
        >>> qk, v = torch.randn(2, 3, 10, 8), torch.randn(2, 3, 10, 8)
        >>> lsh(qk, v).shape
        torch.Size([2, 3, 10, 8])
    """

    def __init__(self, head_dim: int, *, n_buckets: int = 8, n_hashes: int = 4, chunk_size: int = 64,
                 causal: bool = False, dropout: float = 0.0, seed: int = 0):
        super().__init__()
        if n_buckets < 1 or (n_buckets > 1 and n_buckets % 2):
            raise ArgumentError(f"n_buckets must be 1 or even (angular LSH hashes to +-axes); got {n_buckets}")
        if not 0 <= dropout < 1:
            raise ArgumentError(f"dropout must be in [0, 1); got {dropout!r}")
        if min(head_dim, n_hashes, chunk_size) < 1:
            raise ArgumentError(f"head_dim, n_hashes, chunk_size must be >= 1; got {(head_dim, n_hashes, chunk_size)}")
        self.head_dim, self.n_buckets, self.n_hashes = head_dim, n_buckets, n_hashes
        self.chunk_size, self.causal, self.dropout = chunk_size, causal, dropout
        self.register_buffer("rotations", self._draw(torch.Generator().manual_seed(seed)))

    def _draw(self, generator):
        return torch.randn(self.n_hashes, self.head_dim, self.n_buckets // 2, generator=generator)

    @torch.no_grad()
    def redraw(self, generator: torch.Generator | None = None) -> None:
        """Draw new rotations from ``generator`` (a CPU generator; the global RNG if None)."""
        self.rotations.copy_(self._draw(generator).to(self.rotations))

    @torch.no_grad()
    def hash(self, qk: torch.Tensor) -> torch.Tensor:
        """Buckets ``(b, h, n_hashes, n)`` of ``qk`` ``(b, h, n, d)``."""
        if self.n_buckets == 1:
            return qk.new_zeros(*qk.shape[:2], self.n_hashes, qk.shape[2], dtype=torch.long)
        rot = torch.einsum("bhnd,rdk->bhrnk", qk, self.rotations.to(qk.dtype))
        return torch.cat([rot, -rot], dim=-1).argmax(-1)

    def forward(self, qk: torch.Tensor, v: torch.Tensor, *, key_keep_mask: torch.Tensor | None = None):
        if qk.dim() != 4 or qk.shape[-1] != self.head_dim or v.dim() != 4 or v.shape[:3] != qk.shape[:3]:
            raise ShapeError(f"qk must be (b, h, n, {self.head_dim}) and v (b, h, n, dv) with the same b, h, n; "
                             f"got {tuple(qk.shape)} and {tuple(v.shape)}")
        keep = check_keep_mask(type(self).__name__, "key_keep_mask", key_keep_mask, qk.shape[0], qk.shape[2])
        if keep is not None:  # select, so NaN in padding cannot leak through 0 * NaN
            qk, v = (t.masked_fill(~keep[:, None, :, None], 0.0) for t in (qk, v))
        if qk.shape[2] == 0 or qk.shape[0] == 0:
            return v.clone()  # empty sequence or batch: nothing to attend, an empty result
        buckets = self.hash(qk.detach())
        out, lse = self._rounds(qk, v, keep, buckets)  # (b, h, R, n, dv), (b, h, R, n)
        has_other = torch.isfinite(lse).any(2)  # (b, h, n)
        lse = torch.where(has_other.unsqueeze(2), lse, torch.zeros_like(lse))  # no -inf - -inf below
        combined = (torch.softmax(lse, dim=2).unsqueeze(-1) * out).sum(2).to(v.dtype)
        return torch.where(has_other.unsqueeze(-1), combined, v)  # nothing else to see: its own value

    def _rounds(self, qk, v, keep, buckets):
        """Every round at once: sort, chunk, attend to own + previous chunk, unsort."""
        b, h, n, _ = qk.shape
        rounds, c = buckets.shape[2], max(1, min(self.chunk_size, n))
        order = bucket_order(buckets)  # (b, h, R, n)
        pad = (-n) % c
        slot_pos = F.pad(order, (0, pad)).unflatten(3, (-1, c))  # (b, h, R, C, c); padding slots -> 0, unused
        slot_ok = F.pad(torch.ones_like(order, dtype=torch.bool), (0, pad)).unflatten(3, (-1, c))
        if keep is not None:
            slot_ok = slot_ok & _at(keep[:, None].expand(-1, h, -1), slot_pos)
        first = torch.arange(slot_pos.shape[3], device=qk.device).view(1, 1, 1, -1, 1) == 0  # no chunk before
        ok_w = torch.cat([slot_ok.roll(1, dims=3) & ~first, slot_ok], dim=4)  # (b, h, R, C, 2c)
        pos_w = _look_back(slot_pos)
        sorted_bkt = F.pad(buckets.gather(3, order), (0, pad)).unflatten(3, (-1, c))
        allowed = ok_w.unsqueeze(-2) & (sorted_bkt.unsqueeze(-1) == _look_back(sorted_bkt).unsqueeze(-2))
        allowed = allowed & (slot_pos.unsqueeze(-1) != pos_w.unsqueeze(-2))  # (b, h, R, C, c, 2c)
        if self.causal:
            allowed = allowed & (pos_w.unsqueeze(-2) <= slot_pos.unsqueeze(-1))
        q = _at(qk, slot_pos)  # (b, h, R, C, c, d)
        k, vs = _look_back(F.normalize(q, dim=-1)), _look_back(_at(v, slot_pos))  # (b, h, R, C, 2c, .)
        flat = (b, -1, c)  # rounds and chunks become heads of one attention call
        res = attention(q.reshape(*flat, q.shape[-1]), k.reshape(b, -1, 2 * c, k.shape[-1]),
                        vs.reshape(b, -1, 2 * c, vs.shape[-1]), mask=allowed.reshape(*flat, 2 * c),
                        bias=self._duplicates(buckets, slot_pos, pos_w, qk.dtype),
                        dropout_p=self.dropout if self.training else 0.0, return_lse=True)
        inv = order.argsort(-1)  # sorted slot of every position
        out = res.output.reshape(b, h, rounds, -1, v.shape[-1])[:, :, :, :n]
        lse = res.lse.reshape(b, h, rounds, -1)[:, :, :, :n]
        return out.gather(3, inv.unsqueeze(-1).expand_as(out)), lse.gather(3, inv)

    def _duplicates(self, buckets, slot_pos, pos_w, dtype):
        """``-log N_ij`` with N_ij the number of rounds where i and j share a bucket (None for one round)."""
        rounds = buckets.shape[2]
        if rounds == 1:
            return None
        counts = torch.zeros(*slot_pos.shape, pos_w.shape[-1], dtype=torch.int16, device=buckets.device)
        for r in range(rounds):
            counts += _at(buckets[:, :, r], slot_pos).unsqueeze(-1) == _at(buckets[:, :, r], pos_w).unsqueeze(-2)
        b, c = counts.shape[0], counts.shape[-2]
        return -torch.log(counts.clamp_min(1).to(dtype)).reshape(b, -1, c, 2 * c)


def _at(t: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``t[b, h, idx[b, h, ...]]`` for ``t`` ``(b, h, n)`` or ``(b, h, n, e)``."""
    flat = idx.reshape(*idx.shape[:2], -1)
    if t.dim() == 3:
        return t.gather(2, flat).view(idx.shape)
    out = t.gather(2, flat.unsqueeze(-1).expand(-1, -1, -1, t.shape[-1]))
    return out.view(*idx.shape, t.shape[-1])


class ReformerAttention(nn.Module):
    """Reformer self-attention: shared QK projection + :class:`LSHAttention` + output projection.

    Kitaev et al. 2020, arXiv:2001.04451, Sec. 2: ``q = k = x W_QK`` (keys normalised inside
    :class:`LSHAttention`), ``v = x W_V``, heads merged by ``W_O``. Notation: W_QK, W_V, W_O =
    ``qk_proj, v_proj, out_proj``.

    Differences from the paper: those of :class:`LSHAttention`; reversible layers and chunked
    feed-forwards belong to the model, not to the attention.

    Shapes: ``x`` ``(b, n, dim)``, ``key_keep_mask`` ``(b, n)`` bool (True = real token) -> ``(b, n, dim)``.

    Complexity: O(R n c D) time, O(R n c) memory (R rounds, chunk c); buckets add O(n log n).

    Args:
        dim: model width (a multiple of num_heads).
        num_heads: number of heads.
        n_buckets, n_hashes, chunk_size, causal, seed: see :class:`LSHAttention`.
        dropout: on the weights while training.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = ReformerAttention(32, 4, n_buckets=4, n_hashes=2, chunk_size=8, causal=True)
        >>> layer(torch.randn(2, 20, 32)).shape
        torch.Size([2, 20, 32])
    """

    def __init__(self, dim: int, num_heads: int, *, n_buckets: int = 8, n_hashes: int = 4, chunk_size: int = 64,
                 causal: bool = False, dropout: float = 0.0, seed: int = 0):
        super().__init__()
        if num_heads < 1 or dim % num_heads:
            raise ShapeError(f"ReformerAttention: dim must be a multiple of num_heads; got dim={dim}, "
                             f"num_heads={num_heads}")
        self.dim, self.num_heads = dim, num_heads
        self.qk_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim) for _ in range(3))
        self.lsh = LSHAttention(dim // num_heads, n_buckets=n_buckets, n_hashes=n_hashes, chunk_size=chunk_size,
                                causal=causal, dropout=dropout, seed=seed)

    def forward(self, x: torch.Tensor, *, key_keep_mask: torch.Tensor | None = None) -> torch.Tensor:
        who = type(self).__name__
        check_sequence(who, "x", x, self.dim, like=self)
        x = clear_padding(x, check_keep_mask(who, "key_keep_mask", key_keep_mask, *x.shape[:2]))
        qk, v = split_heads(self.qk_proj(x), self.num_heads), split_heads(self.v_proj(x), self.num_heads)
        return self.out_proj(merge_heads(self.lsh(qk, v, key_keep_mask=key_keep_mask)))


def _example():
    g = torch.Generator().manual_seed(0)
    layer = ReformerAttention(32, 4, n_buckets=4, n_hashes=2, chunk_size=4, causal=True)
    return layer, (torch.randn(2, 16, 32, generator=g),)


def _count(t, s, module=None):
    b, n, h, dim, rounds = s["batch"], s["length"], s["heads"], s["dim"], s["n_hashes"]
    d = dim // h
    projections(t, s, 3, "projections (qk, v, out)")
    if n == 0 or b == 0:
        return
    if s["n_buckets"] > 1:
        t.mm("hashing: x R (no gradient)", 1, b * h * n, d, rounds * s["n_buckets"] // 2, grads=0)
    c = max(1, min(s["chunk_size"], n))
    heads = h * rounds * -(-n // c)
    bias = zeros(dtype_of(s), b, heads, c, 2 * c) if rounds > 1 else None
    attend(t, "chunks: ", b, heads, c, 2 * c, d, d, dtype=dtype_of(s), bias=bias, return_lse=True,
           mask=ones(b, heads, c, 2 * c), dropout_p=dropout_of(None if module is None else module.lsh))
    t.ew("sort, gather and round combination", b * h * rounds * n * (2 * d + 8))


def _derive(s):
    if s["n_buckets"] is None:  # chunk m = 2 n / n_buckets (Sec. 2): buckets of about half a chunk
        s["n_buckets"] = 2 * max(1, s["length"] // s["chunk_size"])
    return s


_LSH = ("n_buckets", "n_hashes", "chunk_size", "causal")
register(Entry("reformer", ReformerAttention, "Kitaev et al. 2020, arXiv:2001.04451, Sec. 2",
               "O(L c D R)", "shared-QK angular LSH, sort by bucket, attend within chunks; R rounds",
               "long-sequence", _example,
               spec=Spec({"batch": 2, "length": 16, "dim": 32, "heads": 4, "dtype": "float32", "n_buckets": 4,
                          "n_hashes": 2, "chunk_size": 4, "causal": True, "seed": 0}, _count, sequence_input,
                         "projections 2 B n dim^2 (qk, v, out); hashing 2 B H n d R n_buckets/2; "
                         "chunks 2 B H R ceil(n/c) c (2c) 2d",
                         at_scale={"chunk_size": 64, "n_buckets": None, "n_hashes": 4},
                         source="Kitaev et al. 2020, arXiv:2001.04451, Sec. 2: chunks of m = 2 n / n_buckets "
                                "(m = 64 here, so n_buckets = 2 n / 64); Sec. 5, Fig. 4: 1 to 8 hash rounds (4 here)",
                         make=lambda s: ReformerAttention(s["dim"], s["heads"], **{k: s[k] for k in _LSH},
                                                          seed=s["seed"]).to(dtype_of(s)),
                         derive=_derive, module_type=ReformerAttention, nullable=frozenset({"n_buckets"}),
                         config=lambda m: {"dim": m.dim, "heads": m.num_heads,
                                           **{k: getattr(m.lsh, k) for k in _LSH}})))
