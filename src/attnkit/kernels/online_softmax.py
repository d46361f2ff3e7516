"""Path ``online-softmax``: softmax over key blocks with a running maximum (the FlashAttention recurrence).

Dao et al. 2022 (arXiv:2205.14135, Alg. 1), written with plain torch ops. For a
slab of query rows, key blocks ``j`` arrive one at a time and the running row
max ``m``, normaliser ``l`` and unnormalised output ``acc`` are updated::

    m' = max(m, rowmax(S_j));  c = exp(m - m')
    l' = c * l + rowsum(exp(S_j - m'));  acc' = c * acc + exp(S_j - m') V_j
    out = acc / l;  lse = m + log l

Only a slab of ``rows x kv_block`` scores exists at a time, so memory is
``O((Lq + Lk) D)`` plus a fixed budget, never ``O(Lq Lk)``. Under autograd each
slab of rows is checkpointed: backward recomputes it, holding one slab's graph.
Supports every score, bias, modifier and mask, dropout, sinks (the running sum starts
with the sink's term, the running max at the sink), quantized keys and values (each key
block's codes dequantized as it arrives, :mod:`attnkit.functional.quantize`: never a
full-precision copy of the whole cache), and returns lse: the
``chunked`` backend's general path. The normalisers written over key blocks
(sigmoid attention, softpick, stick-breaking: :mod:`attnkit.functional.blockwise`)
run the same loop with their own state per row, in the same memory. Its faster
siblings for additive biases (:mod:`.bias_slabs`) and soft-capping
(:mod:`.softcap_loop`) come first in the table of paths (:mod:`.paths`).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from ..functional import sinks
from ..functional.blockwise import BLOCKWISE
from ..functional.normalize import guard_empty_rows
from ..functional.validate import Problem
from . import rules
from .path_cost import PathCost, dense_products, itemsize
from .pipeline import (
    KernelOutput,
    block_scores,
    concat_pieces,
    dense_indices,
    dropout,
    kv_block,
    loop_inputs,
    row_chunks,
)
from .pipeline import _only_mask_makes_inf as only_mask_makes_inf

__all__ = ["refusal", "run", "cost", "plan", "BUDGET"]

BUDGET = 1 << 23  # score elements alive at once (32 MB in float32)
KV_BLOCK = 128  # smallest key block without autograd
ROWS = 1024  # query rows per slab without autograd
QUANTIZED_BLOCK = 512  # most keys per block of a quantized cache: the block dequantized at once

_NEG_INF = float("-inf")


REFUSALS = (rules.over_key_blocks, rules.no_weights)


def refusal(p: Problem) -> str | None:
    return rules.first_refusal(p, REFUSALS)


def _slab(p: Problem, start: int, stop: int, q, k, v, block: int):
    batch, heads, _, lk, _, dv = p.sizes
    qc = q[:, :, start:stop]  # (B, H, rows, D)
    rows = stop - start
    m, l = _start(p, qc.new_empty(batch, heads, rows, 1), start, stop)
    acc = qc.new_zeros((batch, heads, rows, dv))
    # Rows the mask leaves a key, where -inf scores can only come from infinite q or k (no bias, modifier,
    # custom score or sink): those rows are not the mask's empty rows (row 1) but NaN (RELIABILITY row 21).
    track = p.sinks is None and only_mask_makes_inf(p)
    keyed: torch.Tensor | bool = False  # True once a block without a mask has been seen
    for ks in range(0, lk, block):
        ke = min(lk, ks + block)
        idx = dense_indices(batch, heads, start, stop, ks, ke, q.device)
        s, allowed = block_scores(p, qc, kv_block(p, k, "k", ks, ke), *idx)  # (B, H, rows, block)
        if allowed is not None:
            s = s.masked_fill(~allowed, _NEG_INF)
        if track and keyed is not True:
            keyed = True if allowed is None else allowed.any(-1, keepdim=True) | keyed
        m_new = torch.maximum(m, s.detach().amax(-1, keepdim=True))
        m_safe = m_new.masked_fill(m_new == _NEG_INF, 0.0)
        correction = torch.exp(m - m_safe)
        e = torch.exp(s - m_safe)
        l = l * correction + e.sum(-1, keepdim=True)
        acc = acc * correction + dropout(p, e) @ kv_block(p, v, "v", ks, ke)
        m = m_new
    rows_keyed = None if keyed is False else torch.ones_like(l, dtype=torch.bool) if keyed is True else keyed
    l_safe, lse = guard_empty_rows(m.masked_fill(m == _NEG_INF, 0.0), l, rows_keyed)
    return acc / l_safe, lse


def _slab_blockwise(p: Problem, start: int, stop: int, q, k, v, block: int):
    """A normaliser over key blocks (:mod:`attnkit.functional.blockwise`): its state per row, block by block."""
    batch, heads, _, lk, _, dv = p.sizes
    rule = BLOCKWISE[p.normalize]
    qc = q[:, :, start:stop]  # (B, H, rows, D)
    state = rule.start(qc.new_zeros(batch, heads, stop - start, 1))
    acc = qc.new_zeros((batch, heads, stop - start, dv))
    firsts = range(0, lk, block)
    for ks in reversed(firsts) if rule.reverse else firsts:
        ke = min(lk, ks + block)
        s, allowed = block_scores(p, qc, kv_block(p, k, "k", ks, ke),
                                  *dense_indices(batch, heads, start, stop, ks, ke, q.device))
        w, state, rescale = rule.block(state, s, allowed, lk)
        acc = (acc if rescale is None else acc * rescale) + dropout(p, w) @ kv_block(p, v, "v", ks, ke)
    divisor = rule.divisor(state)
    return (acc if divisor is None else acc / divisor), None


def _start(p: Problem, like: torch.Tensor, start: int, stop: int):
    """The running max and sum of rows ``start:stop`` before the first key block: empty, or the sink alone (a
    term with no value)."""
    if p.sinks is None:
        return torch.full_like(like, _NEG_INF), torch.zeros_like(like)
    s = sinks.per_row(sinks.rows(p.sinks, start, stop), like)
    m = s.detach().expand_as(like).clone()
    return m, torch.exp(s - m.masked_fill(m == _NEG_INF, 0.0)).expand_as(like)  # 1, or 0 for s = -inf


def plan(p: Problem, grad: bool) -> tuple[int, int]:
    """``(rows per slab, keys per block)`` keeping about BUDGET scores alive (quantized keys and values: at most
    :data:`QUANTIZED_BLOCK` keys per block, the most dequantized at once).

    Under autograd the backward recomputes a slab's whole ``rows x Lk`` graph
    anyway, so the slab is one key block: fewer, larger temporaries, which the
    allocator returns to the OS (many small ones fragment the heap instead).
    """
    batch, heads, lq, lk, _, _ = p.sizes
    if grad:
        rows, keys = max(1, min(lq, BUDGET // max(1, batch * heads * lk))), max(1, lk)
    else:
        rows = max(1, min(lq, ROWS))
        keys = max(1, min(lk, max(KV_BLOCK, BUDGET // max(1, batch * heads * rows))))
    return rows, min(keys, QUANTIZED_BLOCK) if p.quant is not None else keys


def run(p: Problem) -> KernelOutput:
    q, k, v = loop_inputs(p)  # quantized keys and values stay codes: each key block is dequantized alone
    rows, keys = plan(p, p.needs_grad)
    slab = _slab if p.normalize == "softmax" else _slab_blockwise
    def chunk(s, e, q_, k_, v_):
        return slab(p, s, e, q_, k_, v_, keys)
    out, lse = concat_pieces([checkpoint(chunk, s, e, q, k, v, use_reentrant=False) if saved else chunk(s, e, q, k, v)
                              for s, e, saved in row_chunks(p.sizes[2], rows, q, k, v)])
    return KernelOutput(out, None, lse)


def cost(p: Problem, grad: bool = False) -> PathCost:
    """Both products over every pair; under autograd a checkpointed slab runs them again in the backward."""
    b, h, lq, lk, _, _ = p.sizes
    recompute = grad and plan(p, True)[0] < lq
    pairs = b * h * lq * lk
    return PathCost(pairs, 3.0 * min(pairs, BUDGET) * itemsize(p), dense_products(p, recompute=recompute))
