"""Ring attention (Liu et al. 2023, arXiv:2310.01889): K/V blocks passed around the ring, merged by lse.

Rank r holds its queries and, at step s, the K/V block of rank ``src = r - s``
(mod W): it computes that block (every active pair of its query chunks and the
block's key chunks, :mod:`.blocks`) while the block travels on to ``r + 1``
(point-to-point, posted before the compute and waited after: overlap), and merges
the partial results by lse (:mod:`.merge`). A rank holds at most its own block,
the current one and the incoming one: never the whole K/V.

Blocks whose mask is empty are skipped and not sent: block ``src`` travels only
``hops[src]`` steps, the distance to the farthest rank along the ring that needs
it. Causal, contiguous: rank j's block goes to ranks j+1..W-1 only (half the
sends); a causal window no wider than a shard: one hop to the next rank (a halo
exchange). A window that also reaches to the left carries its blocks around the
ring to the left neighbour.

Backward by the reverse ring, recomputing each block: the K/V block travels the
same way again with its accumulator ``dK, dV``; each rank adds its share, and
after the last hop the accumulator is sent home to the block's owner. A block's
gradient is the autograd of its local ``attnkit.attention`` call with the upstream
gradients of the merge: with ``w = exp(lse_j - lse)``::

    d out_j = w * d out,    d lse_j = w * (sum(d out * (out_j - out)) + d lse)

Bytes sent per rank per call, with block ``b = B * H_kv * (L/W) * (D + Dv)``
elements of itemsize s: forward ``(W - 1) * b * s`` with no mask (fewer sends where
blocks stop early); the backward sends the K/V blocks again and ``W`` accumulators
(``W - 1`` hops and the trip home), in float32 for half inputs.
"""

from __future__ import annotations

import torch

from .blocks import Setting, block_attention
from .comm import Comm
from .layouts import chunks_of
from .merge import merge, weight

__all__ = ["RingPlan", "ring_attention", "bytes_sent"]

_KV, _GRAD, _HOME = 0, 1, 2  # message tags


class RingPlan:
    """Who needs which block, how far each block travels, and the two passes over the ring."""

    def __init__(self, comm: Comm, setting: Setting, layout: str):
        self.comm, self.s, self.layout = comm, setting, layout
        w, r = comm.world, comm.rank
        self.q_chunks = chunks_of(layout, r, w)
        self.needs = [[any(setting.active[a][b] for a in chunks_of(layout, dst, w) for b in chunks_of(layout, src, w))
                       for src in range(w)] for dst in range(w)]
        self.hops = [max([t for t in range(w) if self.needs[(src + t) % w][src]], default=0) for src in range(w)]
        self.peak_positions = 0  # most K/V positions held at once (own block, current, incoming)
        self.entries_computed = 0  # score entries of the blocks this rank computed in the forward

    # ------------------------------------------------------------- the schedule
    def source(self, rank: int, step: int) -> int:
        return (rank - step) % self.comm.world

    def holds(self, rank: int, step: int) -> bool:
        return step <= self.hops[self.source(rank, step)]

    def forwards(self, rank: int, step: int) -> bool:
        """Rank ``rank`` passes its block of this step on to ``rank + 1``."""
        return step + 1 <= self.hops[self.source(rank, step)]

    def sends(self) -> tuple[int, int]:
        """``(K/V blocks, gradient accumulators)`` this rank sends in one pass (the accumulators in the backward)."""
        r, w = self.comm.rank, self.comm.world
        forward = sum(self.forwards(r, s) for s in range(w))
        home = sum(0 < s == self.hops[self.source(r, s)] for s in range(w))  # last holder sends it home
        return forward, forward + home

    def _pass_on(self, step, block, tag=_KV):
        """Post this step's transfer of ``block``: to the next rank if it travels on, from the previous one."""
        r = self.comm.rank
        sends = [(block, r + 1, tag)] if block is not None and self.forwards(r, step) else []
        incoming = torch.empty_like(block if block is not None else self._template) if self.forwards(r - 1, step) \
            else None
        recvs = [(incoming, r - 1, tag)] if incoming is not None else []
        held = sum(t.shape[-2] for t in (block, incoming) if t is not None)
        self.peak_positions = max(self.peak_positions, held + (self._template.shape[-2] if step else 0))
        return self.comm.exchange(sends, recvs), incoming

    def _pairs(self, src: int):
        """``(i, a, j, b)``: query chunk i (global a) against the block's key chunk j (global b), where active."""
        kv_chunks = chunks_of(self.layout, src, self.comm.world)
        for i, a in enumerate(self.q_chunks):
            for j, b in enumerate(kv_chunks):
                if self.s.active[a][b]:
                    yield i, a, j, b

    def _block(self, q_chunk, kv, j, a, b, d):
        k_j, v_j = kv.chunk(len(self.q_chunks), -2)[j].split([d, kv.shape[-1] - d], -1)
        c = self.s.chunk
        return block_attention(self.s, q_chunk, k_j, v_j, q0=a * c, k0=b * c, full=self.s.full[a][b])

    # ------------------------------------------------------------- forward
    def forward(self, q, k, v):
        kv = torch.cat([k, v], -1)
        self._template, d, r = kv, k.shape[-1], self.comm.rank
        qs, acc = q.chunk(len(self.q_chunks), -2), [None] * len(self.q_chunks)
        block = kv
        for step in range(self.comm.world):
            block = block if self.holds(r, step) else None
            requests, incoming = self._pass_on(step, block)
            if block is not None and self.needs[r][self.source(r, step)]:
                for i, a, j, b in self._pairs(self.source(r, step)):
                    acc[i] = merge(acc[i], self._block(qs[i], block, j, a, b, d))
                    self.entries_computed += qs[i].shape[-2] ** 2
            self.comm.wait(requests)
            block = incoming
        return self._finish(acc, qs, v)

    def _finish(self, acc, qs, v):
        lse_dtype = torch.float64 if v.dtype == torch.float64 else torch.float32
        outs, lses = [], []
        for part, qc in zip(acc, qs, strict=True):
            if part is None:  # no key anywhere for these rows
                part = (qc.new_zeros(*qc.shape[:-1], v.shape[-1], dtype=lse_dtype),
                        qc.new_full(qc.shape[:-1], float("-inf"), dtype=lse_dtype))
            outs.append(part[0])
            lses.append(part[1])
        return torch.cat(outs, -2).to(v.dtype), torch.cat(lses, -1)

    # ------------------------------------------------------------- backward
    def backward(self, q, k, v, out, lse, dout, dlse):
        kv = torch.cat([k, v], -1)
        acc_dtype = torch.float64 if v.dtype == torch.float64 else torch.float32
        self._template, d, r, w = kv, k.shape[-1], self.comm.rank, self.comm.world
        m = len(self.q_chunks)
        rows = [t.chunk(m, -2) for t in (q, out, dout)] + [t.chunk(m, -1) for t in (lse, dlse)]
        dq = [torch.zeros(qc.shape, dtype=acc_dtype, device=q.device) for qc in rows[0]]
        block, grad, own_grad = kv, torch.zeros(kv.shape, dtype=acc_dtype, device=kv.device), None
        for step in range(w):
            src = self.source(r, step)
            block = block if self.holds(r, step) else None
            requests, incoming = self._pass_on(step, block)
            if block is not None and self.needs[r][src]:
                for i, a, j, b in self._pairs(src):
                    gq, gk, gv = self._block_grads([t[i] for t in rows], block, j, a, b, d)
                    dq[i] += gq
                    grad.chunk(m, -2)[j].add_(torch.cat([gk, gv], -1))
            self.comm.wait(requests)
            grad, own_grad = self._pass_grad(step, block, grad, own_grad)
            block = incoming
        dk, dv = own_grad.split([d, kv.shape[-1] - d], -1)
        return torch.cat(dq, -2).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)

    def _pass_grad(self, step, block, grad, own_grad):
        """Send this step's accumulator on (or home after its last hop); receive the next one and our own."""
        r, w = self.comm.rank, self.comm.world
        sends, recvs = [], []
        if block is not None and self.forwards(r, step):
            sends.append((grad, r + 1, _GRAD))
        elif block is not None and step > 0:
            sends.append((grad, self.source(r, step), _HOME))
        elif block is not None:
            own_grad = grad  # the block never left home
        incoming = torch.empty_like(grad) if self.forwards(r - 1, step) else None
        if incoming is not None:
            recvs.append((incoming, r - 1, _GRAD))
        if step == self.hops[r] and step > 0:
            own_grad = torch.empty_like(grad)
            recvs.append((own_grad, (r + step) % w, _HOME))
        self.comm.wait(self.comm.exchange(sends, recvs))
        next_grad = incoming if incoming is not None else torch.zeros_like(grad)
        return next_grad, own_grad

    def _block_grads(self, row, kv, j, a, b, d):
        """Gradients of one block (recomputed) for q, k, v under the merge's upstream gradients."""
        q_i, out_i, dout_i, lse_i, dlse_i = row
        k_j, v_j = kv.chunk(len(self.q_chunks), -2)[j].split([d, kv.shape[-1] - d], -1)
        leaves = [t.detach().requires_grad_() for t in (q_i, k_j, v_j)]
        with torch.enable_grad():
            c = self.s.chunk
            o_j, l_j = block_attention(self.s, *leaves, q0=a * c, k0=b * c, full=self.s.full[a][b])
            share = weight(l_j.detach(), lse_i)
            g_out = share.unsqueeze(-1) * dout_i
            g_lse = share * ((dout_i * (o_j.detach() - out_i)).sum(-1) + dlse_i)
            # A scalar surrogate with these upstream gradients (rows with lse_j = -inf have share 0: filled out).
            terms = [(t.masked_fill(t == float("-inf"), 0) * g).sum() for t, g in ((o_j, g_out), (l_j, g_lse))
                     if t.requires_grad]
            grads = torch.autograd.grad(sum(terms), leaves, allow_unused=True) if terms else (None, None, None)
        return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves, strict=True)]


class _Ring(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, plan):
        out, lse = plan.forward(q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = plan
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        dq, dk, dv = ctx.plan.backward(*ctx.saved_tensors, dout, dlse)
        return dq, dk, dv, None


def ring_attention(q, k, v, setting: Setting, comm: Comm, layout: str, plan_class=RingPlan):
    """``(out, lse)`` of this rank's queries against the whole sequence, by the ring."""
    return _Ring.apply(q, k, v, plan_class(comm, setting, layout))


def bytes_sent(*, batch, kv_heads, length, head_dim, value_dim, world, itemsize, grad_itemsize=None,
               sends=None, backward=False) -> int:
    """Bytes one rank sends in one call; ``sends`` = ``RingPlan.sends()``, ``(W - 1, W)`` with no mask.

    Forward: ``sends[0]`` K/V blocks. Backward: the same K/V sends again, plus ``sends[1]``
    gradient accumulators in ``grad_itemsize`` (float32 for half inputs).
    """
    kv_sends, grad_sends = (world - 1, world) if sends is None else sends
    block = batch * kv_heads * (length // world) * (head_dim + value_dim)
    if not backward:
        return kv_sends * block * itemsize
    return kv_sends * block * itemsize + grad_sends * block * (grad_itemsize or itemsize)
