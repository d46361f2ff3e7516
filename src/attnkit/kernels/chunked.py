"""The chunked kernel: online softmax over key blocks (the FlashAttention recurrence).

Dao et al. 2022 (arXiv:2205.14135, Alg. 1), written with plain torch ops. For a
slab of query rows, key blocks ``j`` arrive one at a time and the running row
max ``m``, normaliser ``l`` and unnormalised output ``acc`` are updated::

    m' = max(m, rowmax(S_j));  c = exp(m - m')
    l' = c * l + rowsum(exp(S_j - m'));  acc' = c * acc + exp(S_j - m') V_j
    out = acc / l;  lse = m + log l

Only a slab of ``rows x kv_block`` scores exists at a time, so memory is
``O((Lq + Lk) D)`` plus a fixed budget, never ``O(Lq Lk)``. Under autograd each
slab of rows is checkpointed: backward recomputes it, holding one slab's graph.
Supports every score, bias, modifier and mask, dropout, and returns lse.

Two special cases run elsewhere, exact and also in ``O(L)`` memory (explain()
names them): additive biases (float tensors, ALiBi, relative positions) on
torch's fused kernel one slab of query rows at a time (:mod:`.bias_slabs`), and
soft-capping, whose bounded scores need no running maximum (:mod:`.softcap_loop`).
"""

from __future__ import annotations

import torch

from ..functional.normalize import guard_empty_rows
from ..functional.validate import Problem
from . import bias_slabs, softcap_loop
from .common import KernelOutput, block_scores, dense_indices, dropout, run_row_chunks, upcast_inputs

NAME = "chunked"
BUDGET = 1 << 23  # score elements alive at once (32 MB in float32)
KV_BLOCK = 128  # smallest key block without autograd
ROWS = 1024  # query rows per slab without autograd

_NEG_INF = float("-inf")


def refusal(p: Problem) -> str | None:
    if p.normalize != "softmax":
        return f"online softmax only; normalize={p.normalize!r} needs each whole row at once"
    if p.return_weights:
        return "never builds the (Lq, Lk) weights that return_weights asks for"
    return None


def _slab(p: Problem, start: int, stop: int, q, k, v, kv_block: int):
    batch, heads, _, lk, _, dv = p.sizes
    qc = q[:, :, start:stop]  # (B, H, rows, D)
    rows = stop - start
    m = qc.new_full((batch, heads, rows, 1), _NEG_INF)
    l = qc.new_zeros((batch, heads, rows, 1))
    acc = qc.new_zeros((batch, heads, rows, dv))
    for ks in range(0, lk, kv_block):
        ke = min(lk, ks + kv_block)
        idx = dense_indices(batch, heads, start, stop, ks, ke, q.device)
        s, allowed = block_scores(p, qc, k[:, :, ks:ke], *idx)  # (B, H, rows, block)
        if allowed is not None:
            s = s.masked_fill(~allowed, _NEG_INF)
        m_new = torch.maximum(m, s.detach().amax(-1, keepdim=True))
        m_safe = m_new.masked_fill(m_new == _NEG_INF, 0.0)
        correction = torch.exp(m - m_safe)
        e = torch.exp(s - m_safe)
        l = l * correction + e.sum(-1, keepdim=True)
        acc = acc * correction + dropout(p, e) @ v[:, :, ks:ke]
        m = m_new
    l_safe, lse = guard_empty_rows(m.masked_fill(m == _NEG_INF, 0.0), l)
    return acc / l_safe, lse


def plan(p: Problem, grad: bool) -> tuple[int, int]:
    """``(rows per slab, keys per block)`` keeping about BUDGET scores alive.

    Under autograd the backward recomputes a slab's whole ``rows x Lk`` graph
    anyway, so the slab is one key block: fewer, larger temporaries, which the
    allocator returns to the OS (many small ones fragment the heap instead).
    """
    batch, heads, lq, lk, _, _ = p.sizes
    if grad:
        return max(1, min(lq, BUDGET // max(1, batch * heads * lk))), max(1, lk)
    rows = max(1, min(lq, ROWS))
    return rows, max(1, min(lk, max(KV_BLOCK, BUDGET // max(1, batch * heads * rows))))


def describe(p: Problem) -> str:
    """Which of the kernel's paths runs ``p`` (explain() shows it)."""
    if bias_slabs.refusal(p) is None:
        return bias_slabs.describe(p)
    if softcap_loop.refusal(p) is None:
        return softcap_loop.describe(p)
    return "online softmax over key blocks in plain torch"


def run(p: Problem) -> KernelOutput:
    if bias_slabs.refusal(p) is None:  # an additive bias: torch's fused kernel, one slab of rows at a time
        out, lse = bias_slabs.run(p)
        return KernelOutput(out, None, lse)
    if softcap_loop.refusal(p) is None:  # bounded scores: a fixed shift instead of the online maximum
        out, lse = softcap_loop.run(p)
        return KernelOutput(out, None, lse)
    q, k, v = upcast_inputs(p)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    rows, kv_block = plan(p, needs_grad)
    out, lse = run_row_chunks(lambda s, e, q_, k_, v_: _slab(p, s, e, q_, k_, v_, kv_block),
                              p.sizes[2], rows, q, k, v)
    return KernelOutput(out, None, lse)
