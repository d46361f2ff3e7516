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

``dK`` and ``dV`` sum over the queries that chose each key: the real slots are sorted by key once
per call (a stable sort of ``L n`` int32 keys), ``dS`` and ``P`` are gathered into that order, and
``embedding_bag`` sums each key's query rows. The forward keeps ``P`` (``B H L n`` values) for the
backward when that is at most ``SAVE_BUDGET`` elements; past it the backward recomputes ``S``.
Nothing ``L x L`` exists: the largest temporaries are ``(L, n)`` per head.

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
from .selected_pairs import plain_causal

__all__ = ["applies", "run", "density", "cost", "describe", "attend", "SAVE_BUDGET"]

SAVE_BUDGET = 1 << 28  # weights kept from the forward for the backward (B H L n elements); past it: recomputed
_NEG_INF = float("-inf")


class _Pattern:
    """One index batch's selection as CSR slots ``(L, n)``, and (built on demand) the real slots sorted by key."""

    def __init__(self, idx: torch.Tensor, length: int, dtype: torch.dtype):
        n = idx.shape[-1]
        t = torch.arange(length, device=idx.device)
        self.length, self.n, self.dtype = length, n, dtype
        self.real = (idx >= 0) & (idx <= t[:, None])  # (L, n): an unused slot or a later key is masked
        self.col = idx.clamp(0, max(length - 1, 0)).to(torch.int32).reshape(-1)
        self.crow = torch.arange(0, length * n + 1, n, dtype=torch.int32, device=idx.device)
        self.starts = self.crow[:-1]
        self.order: torch.Tensor | None = None

    def sampled(self, a: torch.Tensor, b: torch.Tensor, alpha: float) -> torch.Tensor:
        """``alpha (a b^T)[t, col]`` for every slot, ``(L, n)``: one dot product per slot (SDDMM)."""
        values = a.new_zeros(self.length * self.n)
        with warnings.catch_warnings():  # torch's "sparse CSR is beta" notice
            warnings.simplefilter("ignore")
            csr = torch.sparse_csr_tensor(self.crow, self.col, values, (self.length, self.length),
                                          check_invariants=False)
        torch.sparse.sampled_addmm(csr, a, b.T, beta=0.0, alpha=alpha, out=csr)  # written into ``values``
        return values.view(self.length, self.n)

    def rows(self, table: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``sum_j weights[t, j] table[col[t, j]]`` for every query ``t``: ``(L, E)``."""
        return F.embedding_bag(self.col, table, self.starts, mode="sum", per_sample_weights=weights.reshape(-1))

    def by_key(self, table: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``sum_{(t, j): col[t, j] = s} weights[t, j] table[t]`` for every key ``s`` (real slots only): ``(L, E)``."""
        if self.order is None:
            key = torch.where(self.real.reshape(-1), self.col, self.length)  # unused slots sort last
            self.order = key.argsort(stable=True)[:int(self.real.sum())]
            self.query = (self.order // self.n).to(torch.int32)
            counts = torch.bincount(key, minlength=self.length + 1)[:self.length]
            self.key_starts = (counts.cumsum(0) - counts).to(torch.int32)
        w = weights.reshape(-1).index_select(0, self.order)
        return F.embedding_bag(self.query, table, self.key_starts, mode="sum", per_sample_weights=w)


def _patterns(idx: torch.Tensor, length: int, dtype: torch.dtype) -> list[_Pattern]:
    return [_Pattern(idx[i, 0], length, dtype) for i in range(idx.shape[0])]


def _weights(pat: _Pattern, q, k, scale: float, lse: torch.Tensor | None = None):
    """``(P, lse)`` of one head: ``P`` ``(L, n)`` (0 on masked slots), ``lse`` ``(L,)`` (``-inf``: no key)."""
    s = pat.sampled(q, k, scale).masked_fill_(~pat.real, _NEG_INF)
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
        for h in range(heads):
            p, lse[b, h] = _weights(pat, q[b, h], k[b, h // group], scale)
            out[b, h] = pat.rows(v[b, h // group], p)
            if kept is not None:
                kept[b, h] = p
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
            kh, vh = k[b, h // group], v[b, h // group]
            p = kept[b, h] if kept is not None else _weights(pat, q[b, h], kh, scale, lse[b, h])[0]
            ds = pat.sampled(dout[b, h], vh, 1.0).sub_(delta[b, h, :, None]).mul_(p)
            ds.masked_fill_(~pat.real, 0.0)  # a masked slot's dP (its key's values) never reaches a gradient
            dq[b, h] = pat.rows(kh, ds).mul_(scale)
            dk[b, h // group] += pat.by_key(q[b, h], ds).mul_(scale)
            dv[b, h // group] += pat.by_key(dout[b, h], p)
    return dq, dk, dv


class _SelectedRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, idx, scale):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        pats = _patterns(idx, q.shape[2], q.dtype)
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
