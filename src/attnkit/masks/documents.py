"""Documents packed in one row, each starting on a block boundary: a mask whose block layout is block diagonal.

:func:`attnkit.varlen_attn` lays packed documents (``cu_seq_q``, ``cu_seq_k``) out so that
every document starts on a block of ``block_size`` positions, the lanes after its end left
empty. A query attends a key when both belong to the same document and the document's own
mask (``within``: a window, causality, any attnkit mask) allows them at their positions
*in the document*, with the document's own lengths: query ``i`` of a document with
``Lq_d`` queries and ``Lk_d`` keys sits at local position ``i``, and bottom-right masks
align it to ``Lk_d``. The block layout at ``block_size`` is computed per document block,
never over ``T x T``: a query block meets only its own document's key blocks, so the
block-sparse paths compute ``sum_d Lq_d Lk_d`` scores (up to the blocks' padding lanes).
"""

from __future__ import annotations

import torch

from .base import Mask

__all__ = ["Documents", "BAND_UNBOUNDED"]

BAND_UNBOUNDED = 1 << 40  # an open side of a band, as a bound no document reaches
_PAIRS = 1 << 12  # block pairs evaluated at once when ``within`` is not a band


def _positions(starts: torch.Tensor, lengths: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position of a ``total``-long row: its document (-1: an empty lane) and its position in the document."""
    doc = torch.full((total + 1,), -1, dtype=torch.long, device=starts.device)
    ids = torch.arange(len(starts), device=starts.device)
    owner = torch.repeat_interleave(ids, lengths)  # one entry per real position, document order
    local = torch.arange(owner.numel(), device=starts.device) - torch.repeat_interleave(
        torch.cumsum(lengths, 0) - lengths, lengths)
    doc[(starts[owner] + local)] = owner
    pos = torch.zeros(total + 1, dtype=torch.long, device=starts.device)
    pos[(starts[owner] + local)] = local
    return doc[:total], pos[:total]


class Documents(Mask):
    """Query ``i`` sees key ``j`` when both lie in document ``d`` and ``within`` allows them there.

    Args:
        q_starts: first row of each document's queries ``(N,)``, multiples of ``block_size``.
        q_lengths: queries per document ``(N,)``.
        k_starts: first row of each document's keys ``(N,)``, multiples of ``block_size``.
        k_lengths: keys per document ``(N,)``.
        q_total: rows of the padded query sequence.
        k_total: rows of the padded key sequence.
        block_size: the block the documents are aligned to; the block-sparse paths plan with it.
        within: the mask inside each document (None: every key of the document), evaluated at
            positions in the document with tensor lengths (elementwise masks: causal, windows,
            diagonals, strided, fixed, prefix LM, functions of indices).
    """

    uses = frozenset({"q", "kv"})

    def __init__(self, q_starts, q_lengths, k_starts, k_lengths, q_total: int, k_total: int, block_size: int,
                 within: Mask | None = None):
        self.q_lengths, self.k_lengths, self.within = q_lengths, k_lengths, within
        self.plan_block_size = block_size
        self.q_starts, self.k_starts = q_starts, k_starts
        self.q_doc, self.q_pos = _positions(q_starts, q_lengths, q_total)
        self.k_doc, self.k_pos = _positions(k_starts, k_lengths, k_total)
        self.q_len, self.kv_len = q_total, k_total
        if within is not None:
            self.uses = self.uses | (within.uses & {"b", "h"})
            self.batch_size, self.num_heads = within.batch_size, within.num_heads

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        dev = q_idx.device
        qd, kd = self.q_doc.to(dev)[q_idx], self.k_doc.to(dev)[kv_idx]
        allowed = (qd == kd) & (qd >= 0)
        if self.within is None:
            return allowed
        doc = qd.clamp(min=0)
        inside = self.within.allows(b, h, self.q_pos.to(dev)[q_idx], self.k_pos.to(dev)[kv_idx],
                                    self.q_lengths.to(dev)[doc], self.k_lengths.to(dev)[doc])
        return allowed & inside

    def _blocks(self, starts, lengths, total, bs, device):
        """Per block of the row: its document (-1: none), first and last real local position."""
        n = -(-total // bs)
        first = torch.arange(n, device=device) * bs
        doc = torch.full((n,), -1, dtype=torch.long, device=device)
        count = -(-lengths // bs)
        owner = torch.repeat_interleave(torch.arange(len(starts), device=device), count)
        index = torch.arange(owner.numel(), device=device) - torch.repeat_interleave(torch.cumsum(count, 0) - count,
                                                                                      count)
        doc[starts[owner] // bs + index] = owner
        lo = first - starts.to(device)[doc.clamp(min=0)]
        hi = torch.minimum(lo + bs, lengths.to(device)[doc.clamp(min=0)]) - 1
        return doc, lo, hi

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        if bs != self.plan_block_size or q_len != self.q_len or kv_len != self.kv_len:
            return self._evaluated_layout(q_len, kv_len, bs, device, sizes)
        qd, r0, r1 = self._blocks(self.q_starts.to(device), self.q_lengths.to(device), q_len, bs, device)
        kd, c0, c1 = self._blocks(self.k_starts.to(device), self.k_lengths.to(device), kv_len, bs, device)
        same = (qd[:, None] == kd[None, :]) & (qd[:, None] >= 0)
        whole = ((r1 - r0 + 1) == bs)[:, None] & ((c1 - c0 + 1) == bs)[None, :]
        if self.within is None:
            return same[None, None], (same & whole)[None, None]
        if self.within.band_terms is None:
            return self._pair_layout(same, qd, bs, device, sizes)
        doc = qd.clamp(min=0)
        offset = (self.k_lengths.to(device) - self.q_lengths.to(device))[doc][:, None]
        los, his = self.within.band_terms
        lo = torch.stack([c + s * offset for c, s in los]).amax(0) if los else torch.full_like(offset, -BAND_UNBOUNDED)
        hi = torch.stack([c + s * offset for c, s in his]).amin(0) if his else torch.full_like(offset, BAND_UNBOUNDED)
        least, most = c0[None, :] - r1[:, None], c1[None, :] - r0[:, None]  # the range of j - i over the block
        active = same & (least <= hi) & (most >= lo) & (lo <= hi)
        return active[None, None], (active & whole & (most <= hi) & (least >= lo))[None, None]

    def _pair_layout(self, same, qd, bs, device, sizes):
        """Exact layout from the predicate, evaluated on the block pairs of each document only."""
        batch, heads = sizes
        pairs = same.nonzero()
        active = torch.zeros(batch, heads, *same.shape, dtype=torch.bool, device=device)
        full = torch.zeros_like(active)
        lane = torch.arange(bs, device=device)
        b = torch.arange(batch, device=device).view(-1, 1, 1, 1, 1)
        h = torch.arange(heads, device=device).view(1, -1, 1, 1, 1)
        for start in range(0, len(pairs), _PAIRS):
            chunk = pairs[start:start + _PAIRS]
            qi = (chunk[:, 0:1] * bs + lane).clamp(max=self.q_len - 1)  # (M, bs); lanes past the row: never real
            kj = (chunk[:, 1:2] * bs + lane).clamp(max=self.kv_len - 1)
            real = ((chunk[:, 0:1] * bs + lane) < self.q_len)[:, :, None] & (
                (chunk[:, 1:2] * bs + lane) < self.kv_len)[:, None, :]
            allowed = self.allows(b, h, qi.view(1, 1, -1, bs, 1), kj.view(1, 1, -1, 1, bs), self.q_len, self.kv_len)
            allowed = torch.broadcast_to(allowed & real, (batch, heads, len(chunk), bs, bs))
            active[:, :, chunk[:, 0], chunk[:, 1]] = allowed.any(-1).any(-1)
            full[:, :, chunk[:, 0], chunk[:, 1]] = allowed.all(-1).all(-1)
        return active, full

    def __repr__(self):
        within = "" if self.within is None else f", within={self.within!r}"
        return f"documents(n={len(self.q_lengths)}, block_size={self.plan_block_size}{within})"
