"""Ring attention (Liu et al. 2023, arXiv:2310.01889): K/V blocks passed around the ring, merged by lse.

Rank r holds its queries and, at step s, the K/V block of rank ``src = r - s``
(mod W): it computes that block (every active pair of its query chunks and the
block's key chunks, :mod:`.blocks`) while the block travels on to ``r + 1``
(point-to-point, posted before the compute and waited after: overlap), and merges
the partial results by lse (:mod:`.merge`). A rank holds its own block, the
current one and the incoming one per direction: never the whole K/V.

Blocks whose mask is empty are skipped and not sent: block ``src`` travels only as
far as the farthest rank that needs it (:mod:`.ring_schedule`), forward (to r + 1,
r + 2, ...) and, where that is shorter, also backward (to r - 1, ...), as a second
lane of the same schedule. Causal, contiguous: rank j's block goes to ranks
j+1..W-1 only (half the sends); a window no wider than a shard: one hop to each
neighbour it reaches (a halo exchange); no mask: the plain ring, W - 1 hops.

Backward by the ring again, recomputing each block: the K/V block travels the
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
from .ring_schedule import RingSchedule

__all__ = ["RingPlan", "ring_attention", "bytes_sent"]

_KV, _GRAD, _HOME = 0, 1, 2  # message tags (plus 3 * lane)


class RingPlan(RingSchedule):
    """The two passes over the ring on this rank's shards, by the schedule."""

    def __init__(self, comm: Comm, setting: Setting, layout: str):
        super().__init__(comm, setting, layout)
        self.peak_positions = 0  # most K/V positions held at once (own block, current and incoming ones)
        self.entries_computed = 0  # score entries of the blocks this rank computed in the forward

    def _pass_on(self, lane, step, block):
        """Post this step's transfer of ``block`` along ``lane``: on to the next rank, in from the previous one."""
        r, ahead = self.comm.rank, lane.direction
        sends = [(block, r + ahead, _KV + lane.tag)] if block is not None and self.forwards(lane, r, step) else []
        incoming = torch.empty_like(self._own) if self.forwards(lane, r - ahead, step) else None
        recvs = [(incoming, r - ahead, _KV + lane.tag)] if incoming is not None else []
        return self.comm.exchange(sends, recvs), incoming

    def _note_held(self, *tensors):
        distinct = {id(t): t for t in (self._own, *tensors) if t is not None}
        self.peak_positions = max(self.peak_positions, sum(t.shape[-2] for t in distinct.values()))

    def _step_blocks(self, step, blocks):
        """The blocks this rank holds at this step, per lane (None: none), and the transfers for the next one."""
        r, requests, incoming = self.comm.rank, [], []
        for n, lane in enumerate(self.lanes):
            blocks[n] = blocks[n] if blocks[n] is not None and self.holds(lane, r, step) else None
            posted, arriving = self._pass_on(lane, step, blocks[n])
            requests += posted
            incoming.append(arriving)
        self._note_held(*blocks, *incoming)
        work = [(n, lane, self.source(lane, r, step)) for n, lane in enumerate(self.lanes)
                if blocks[n] is not None and (step > 0 or n == 0)]  # step 0: the own block, computed once
        return [(n, lane, src) for n, lane, src in work if self.needs[r][src]], requests, incoming

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
        self._own, d = torch.cat([k, v], -1), k.shape[-1]
        qs, acc = q.chunk(len(self.q_chunks), -2), [None] * len(self.q_chunks)
        blocks = [self._own] * len(self.lanes)
        for step in range(self.comm.world):
            work, requests, incoming = self._step_blocks(step, blocks)
            for n, _, src in work:
                for i, a, j, b in self._pairs(src):
                    acc[i] = merge(acc[i], self._block(qs[i], blocks[n], j, a, b, d))
                    self.entries_computed += qs[i].shape[-2] ** 2
            self.comm.wait(requests)
            blocks = incoming
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
        self._own, d = torch.cat([k, v], -1), k.shape[-1]
        acc_dtype = torch.float64 if v.dtype == torch.float64 else torch.float32
        m = len(self.q_chunks)
        rows = [t.chunk(m, -2) for t in (q, out, dout)] + [t.chunk(m, -1) for t in (lse, dlse)]
        dq = [torch.zeros(qc.shape, dtype=acc_dtype, device=q.device) for qc in rows[0]]
        blocks = [self._own] * len(self.lanes)
        grads = [torch.zeros(self._own.shape, dtype=acc_dtype, device=q.device) for _ in self.lanes]
        own_grad = torch.zeros_like(grads[0])
        for step in range(self.comm.world):
            work, requests, incoming = self._step_blocks(step, blocks)
            for n, _, src in work:
                for i, a, j, b in self._pairs(src):
                    gq, gk, gv = self._block_grads([t[i] for t in rows], blocks[n], j, a, b, d)
                    dq[i] += gq
                    grads[n].chunk(m, -2)[j].add_(torch.cat([gk, gv], -1))
            self.comm.wait(requests)
            grads, home = self._pass_grads(step, blocks, grads)
            for part in home:
                own_grad += part
            blocks = incoming
        dk, dv = own_grad.split([d, own_grad.shape[-1] - d], -1)
        return torch.cat(dq, -2).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)

    def _pass_grads(self, step, blocks, grads):
        """Send each lane's accumulator on (or home after its last hop); receive the next ones and our own."""
        r, w = self.comm.rank, self.comm.world
        sends, recvs, next_grads, home = [], [], [], []
        for lane, block, grad in zip(self.lanes, blocks, grads, strict=True):
            if block is not None and self.forwards(lane, r, step):
                sends.append((grad, r + lane.direction, _GRAD + lane.tag))
            elif block is not None and step > 0:
                sends.append((grad, self.source(lane, r, step), _HOME + lane.tag))
            elif block is not None:
                home.append(grad)  # the block never left home
            arriving = torch.empty_like(grad) if self.forwards(lane, r - lane.direction, step) else None
            if arriving is not None:
                recvs.append((arriving, r - lane.direction, _GRAD + lane.tag))
            next_grads.append(arriving if arriving is not None else torch.zeros_like(grad))
            if step == lane.hops[r] and step > 0:
                home.append(torch.empty_like(grad))
                recvs.append((home[-1], (r + lane.direction * step) % w, _HOME + lane.tag))
        self.comm.wait(self.comm.exchange(sends, recvs))
        return next_grads, home

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
