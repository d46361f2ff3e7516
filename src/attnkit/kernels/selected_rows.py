"""Causal attention over per-query selected keys (DSA's top-k) as sparse products: ``O(L k D)`` time, ``O(L k)`` memory.

DeepSeek-AI 2025, arXiv:2512.02556, eq. 2: query ``t`` attends the keys ``S_t`` its indexer chose::

    out_t = softmax_{j in S_t, j <= t}(q_t k_j^T * scale) V[S_t]

The selection is a sparse ``L x L`` matrix in CSR form: row ``t`` holds query ``t``'s ``n`` slots (an
unused slot, -1, or a later key reads key 0 and is masked with ``-inf``). Per batch entry and head::

    S   = (Q K^T)[pattern] * scale                a dot product per selected pair: torch.sparse.sampled_addmm
    lse = logsumexp_row(S),  P = exp(S - lse)      on the (L, n) slots
    O   = P V                                      F.embedding_bag(mode="sum", per_sample_weights=P)

``embedding_bag`` sums each query's weighted value rows without a gathered copy of ``V[S_t]``.
The backward (a custom ``autograd.Function``) is FlashAttention-2's (Dao 2023, Alg. 2) on the
selected pairs::

    dP = (dO V^T)[pattern],  dS = P (dP - rowsum(dO * O)),  dQ = scale dS K
    dK = scale dS^T Q,       dV = P^T dO

Queries are taken ``SLOTS // n`` at a time (their slots stay in cache); where a head's keys outgrow
``SORT_BYTES``, each row's keys are sorted first (one sort per chunk), so they are read in address
order. ``dK`` and ``dV`` sum over the queries that chose each key: a chunk's real slots are sorted
by key once per call (a stable sort of int32 keys, shared by the heads), ``dS`` and ``P`` are
gathered into that order, and ``embedding_bag`` sums each key's query rows. A chunk whose slots
are all real is not masked. The heads run one after another (a head's keys stay in cache).
The forward keeps ``P`` (``B H L n`` values) for the backward when that is at most ``SAVE_BUDGET``
elements; past it the backward recomputes ``S``.
Nothing ``L x L`` exists: beside the kept weights, the temporaries are a chunk's slots.

Shapes: ``q`` ``(B, H, L, D)``, ``k`` ``(B, H_kv, L, D)``, ``v`` ``(B, H_kv, L, Dv)``, ``indices``
``(B|1, 1, L, n)`` distinct key positions (``-1``: unused), shared by every head.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from ..functional.validate import Problem
from ..masks.selected import selection_of
from .path_cost import PathCost, itemsize
from .pipeline import KernelOutput
from .rules import plain_causal

__all__ = ["applies", "run", "density", "cost", "describe", "attend", "SAVE_BUDGET", "SLOTS", "SORT_BYTES"]

SAVE_BUDGET = 1 << 28  # weights kept from the forward for the backward (B H L n elements); past it: recomputed
SLOTS = 1 << 18  # slots (query rows x n) per chunk of queries: a chunk's scores and its sort stay in cache
SORT_BYTES = 1 << 21  # a head's keys past this size: each row's keys sorted (read in address order)
_NEG_INF = float("-inf")


class _Pattern:
    """One index batch's selection as CSR slots ``(L, n)``, cut into chunks of query rows; per chunk (built on
    demand) its real slots sorted by key."""

    def __init__(self, idx: torch.Tensor, length: int, table_bytes: int):
        n = idx.shape[-1]
        t = torch.arange(length, device=idx.device)
        self.length, self.n = length, n
        rows = max(1, SLOTS // max(1, n))
        self.chunks = [(r0, min(length, r0 + rows)) for r0 in range(0, length, rows)]
        # Where a head's keys outgrow the cache, each row's keys ascending (unused slots and later keys last, as
        # key L): keys and values read in address order. One sort of (row, key) per chunk, far cheaper than
        # sorting the rows one by one.
        key = torch.where((idx >= 0) & (idx <= t[:, None]), idx, length)
        wide = torch.int64 if rows * (length + 1) >= 2**31 else torch.int32
        for r0, r1 in self.chunks if table_bytes > SORT_BYTES else ():
            shift = torch.arange(r1 - r0, dtype=wide, device=idx.device).view(-1, 1) * (length + 1)
            key[r0:r1] = ((key[r0:r1].to(wide) + shift).view(-1).sort().values.view(r1 - r0, n) - shift)
        self.real = key < length  # (L, n): an unused slot or a later key is masked
        self.col = key.masked_fill_(~self.real, 0).to(torch.int32).reshape(-1)
        self.masked = {r0: ~self.real[r0:r1] for r0, r1 in self.chunks if not bool(self.real[r0:r1].all())}
        self.crow = torch.arange(0, rows * n + 1, n, dtype=torch.int32, device=idx.device)
        self.keyed: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def sampled(self, r0: int, r1: int, a: torch.Tensor, b: torch.Tensor, alpha: float,
                out: torch.Tensor | None = None) -> torch.Tensor:
        """``alpha (a b^T)[t, col]`` for every slot of queries ``[r0, r1)`` (``a`` their rows), ``(r1 - r0, n)``:
        one dot product per slot (SDDMM), written into ``out`` when given."""
        c = r1 - r0
        values = a.new_zeros(c * self.n) if out is None else out.view(-1).zero_()
        with warnings.catch_warnings():  # torch's "sparse CSR is beta" notice
            warnings.simplefilter("ignore")
            csr = torch.sparse_csr_tensor(self.crow[:c + 1], self.col[r0 * self.n:r1 * self.n], values,
                                          (c, self.length), check_invariants=False)
        torch.sparse.sampled_addmm(csr, a, b.T, beta=0.0, alpha=alpha, out=csr)  # written into ``values``
        return values.view(c, self.n)

    def rows(self, r0: int, r1: int, table: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``sum_j weights[t, j] table[col[t, j]]`` for the queries ``t`` in ``[r0, r1)``: ``(r1 - r0, E)``."""
        return F.embedding_bag(self.col[r0 * self.n:r1 * self.n], table, self.crow[:r1 - r0], mode="sum",
                               per_sample_weights=weights.reshape(-1))

    def by_key(self, r0: int, r1: int, table: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``sum_{(t, j): col[t, j] = s} weights[t, j] table[t]`` over the real slots of queries ``[r0, r1)``, for
        every key ``s < r1``: ``(r1, E)``."""
        if r0 not in self.keyed:
            key = torch.where(self.real[r0:r1].reshape(-1), self.col[r0 * self.n:r1 * self.n], r1)  # unused: last
            order = key.argsort(stable=True)[:int(self.real[r0:r1].sum())]
            counts = torch.bincount(key, minlength=r1 + 1)[:r1]
            starts = (counts.cumsum(0) - counts).to(torch.int32)
            self.keyed[r0] = (order.to(torch.int32), (order // self.n + r0).to(torch.int32), starts)
        order, query, starts = self.keyed[r0]
        w = weights.reshape(-1).index_select(0, order)
        return F.embedding_bag(query, table, starts, mode="sum", per_sample_weights=w)


def _weights(pat: _Pattern, r0: int, r1: int, q, k, scale: float, lse: torch.Tensor | None = None,
             out: torch.Tensor | None = None):
    """``(P, lse)`` of one head's queries ``[r0, r1)``: ``P`` ``(r1 - r0, n)`` (0 on masked slots), ``lse``
    ``(r1 - r0,)`` (``-inf``: no key)."""
    s = pat.sampled(r0, r1, q[r0:r1], k, scale, out)
    if r0 in pat.masked:  # a chunk whose slots are all real needs no mask
        s.masked_fill_(pat.masked[r0], _NEG_INF)
    if lse is None:
        lse = torch.logsumexp(s, -1)
    return s.sub_(lse.masked_fill(lse == _NEG_INF, 0.0)[:, None]).exp_(), lse


def _forward(q, k, v, pats, scale, keep: bool):
    batch, heads, length, _ = q.shape
    group = heads // k.shape[1]
    out = q.new_empty(batch, heads, length, v.shape[-1])
    lse = q.new_empty(batch, heads, length)
    kept = q.new_empty(batch, heads, length, pats[0].n) if keep else None
    for b in range(batch):
        pat = pats[b if len(pats) > 1 else 0]
        for h in range(heads):  # a head's keys and values stay in cache across its chunks
            for r0, r1 in pat.chunks:
                p, lse[b, h, r0:r1] = _weights(pat, r0, r1, q[b, h], k[b, h // group], scale,
                                               out=None if kept is None else kept[b, h, r0:r1])
                out[b, h, r0:r1] = pat.rows(r0, r1, v[b, h // group], p)
    return out, lse, kept


def _backward(q, k, v, pats, out, lse, kept, dout, scale):
    batch, heads, _, _ = q.shape
    group = heads // k.shape[1]
    dq = torch.empty_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    delta = (dout * out).sum(-1)  # (B, H, L): rowsum(dO * O)
    for b in range(batch):
        pat = pats[b if len(pats) > 1 else 0]
        for h in range(heads):
            for r0, r1 in pat.chunks:
                kh, vh = k[b, h // group], v[b, h // group]
                p = kept[b, h, r0:r1] if kept is not None else _weights(pat, r0, r1, q[b, h], kh, scale,
                                                                          lse[b, h, r0:r1])[0]
                ds = pat.sampled(r0, r1, dout[b, h, r0:r1], vh, 1.0).sub_(delta[b, h, r0:r1, None]).mul_(p)
                if r0 in pat.masked:  # a masked slot's dP (its key's values) reaches no gradient
                    ds.masked_fill_(pat.masked[r0], 0.0)
                ds.mul_(scale)
                dq[b, h, r0:r1] = pat.rows(r0, r1, kh, ds)
                dk[b, h // group, :r1] += pat.by_key(r0, r1, q[b, h], ds)
                dv[b, h // group, :r1] += pat.by_key(r0, r1, dout[b, h], p)
    return dq, dk, dv


class _SelectedRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, idx, scale):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        table = q.shape[2] * max(q.shape[3], v.shape[3]) * q.element_size()
        pats = [_Pattern(idx[i, 0], q.shape[2], table) for i in range(idx.shape[0])]
        keep = q.shape[0] * q.shape[1] * q.shape[2] * idx.shape[-1] <= SAVE_BUDGET
        out, lse, kept = _forward(q, k, v, pats, scale, keep and any(ctx.needs_input_grad[:3]))
        ctx.save_for_backward(q, k, v, out, lse, *(() if kept is None else (kept,)))
        ctx.pats, ctx.scale = pats, scale
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, *kept = ctx.saved_tensors
        grads = _backward(q, k, v, ctx.pats, out, lse, kept[0] if kept else None, dout.contiguous(), ctx.scale)
        return (*grads, None, None)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, scale: float):
    """``(out (B, H, L, Dv), lse (B, H, L))`` of causal attention over each query's selected keys."""
    indices = indices.to(q.device)
    if indices.shape[-1] > q.shape[2]:  # more slots than keys: the distinct keys first (-1 last), L slots kept
        indices = indices.sort(-1, descending=True).values[..., :q.shape[2]]
    return _SelectedRows.apply(q, k, v, indices, scale)


def applies(p: Problem) -> bool:
    """Single selected keys shared by the heads (``indices`` ``(B|1, 1, L, n)``) with a causal mask, otherwise as
    :func:`.selected_pairs.applies`."""
    sel = selection_of(p.mask)
    return (sel.block_size == 1 and sel.lengths is None and sel.indices.shape[2] > 1 and sel.indices.shape[1] == 1
            and plain_causal(p))


def density(p: Problem) -> float:
    return min(1.0, selection_of(p.mask).indices.shape[-1] / max(1, p.sizes[3]))


def describe(p: Problem) -> str:
    n = selection_of(p.mask).indices.shape[-1]
    return (f"selected keys as sparse products (a dot per selected pair, embedding-bag sums; the backward sums "
            f"dK, dV per key): L*k = {p.sizes[2]} x {n} pairs per head")


def _real_slots(p: Problem) -> tuple[int, int]:
    """``(n, R)``: slots per query (at most ``L``) and the real slots (``0 <= key <= t``) over the batch."""
    idx = selection_of(p.mask).indices
    batch, _, lq, _, _, _ = p.sizes
    n = min(idx.shape[-1], lq)
    if idx.shape[-1] > lq:
        idx = idx.sort(-1, descending=True).values[..., :lq]
    t = torch.arange(lq, device=idx.device).view(-1, 1)
    real = int(((idx >= 0) & (idx <= t)).sum())
    return n, real * (batch // idx.shape[0])


def cost(p: Problem, grad: bool = False) -> PathCost:
    """Per head, over the ``L n`` slots: forward ``2 L n D`` (sampled dot products) + ``2 L n Dv`` (embedding-bag
    sums); backward ``2 L n Dv`` (dP) + ``2 L n D`` (dQ) + ``2 R (D + Dv)`` (dK, dV over the ``R`` real slots),
    plus ``2 L n D`` when the scores are recomputed. Workspace: a head's ``(L, n)`` slots, and the weights kept for
    the backward."""
    batch, heads, lq, _, d, dv = p.sizes
    n, real = _real_slots(p)
    pairs = batch * heads * lq * n
    kept = pairs <= SAVE_BUDGET
    backward = 2 * pairs * (d + dv) + 2 * heads * real * (d + dv) + (0 if kept else 2 * pairs * d)
    workspace = (4 * lq * n + (pairs if kept and grad else 0)) * itemsize(p) + 3 * lq * n * 4
    return PathCost(pairs, float(workspace), (),
                    fused=("attention (selected keys: sampled dot products, embedding-bag sums)",
                           2 * pairs * (d + dv), backward), materialized=True)


def run(p: Problem) -> KernelOutput:
    out, lse = attend(p.q, p.k, p.v, selection_of(p.mask).indices, p.scale)
    return KernelOutput(out, None, lse if p.return_lse else None)
