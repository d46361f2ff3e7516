"""The block-sparse kernel: computes only the (query block, key block) pairs a mask allows.

The mask's :class:`~attnkit.masks.BlockLayout` says which key blocks each query
block may touch. For query block ``I`` the active key blocks ``J_1..J_w`` are
gathered into one ``(w * bs)``-long key row, so attention is a batched matmul
over ``(nq, bs) x (w * bs)`` scores: ``O(L * w * bs * D)`` work and memory,
never ``O(Lq Lk)``. Inside the gathered row the exact mask is evaluated at the
gathered indices, so partial blocks are exact; padding lanes and unused slots are
masked out. With no mask the layout is full: plain dense attention.
Rows are normalised whole, so softmax, sparsemax, sigmoid and hard
all work; autograd provides the backward (the gather's backward scatter-adds
into the key blocks, deterministically on CPU). Large problems run in
checkpointed slabs of query blocks to bound memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..functional.masks import full
from ..functional.validate import Problem
from .common import KernelOutput, block_scores, block_weights, dropout, run_row_chunks, upcast_inputs

NAME = "blocksparse"
BLOCK_SIZES = (64, 128)
BUDGET = 1 << 25  # gathered score elements alive at once


def refusal(p: Problem) -> str | None:
    if p.return_weights:
        return "never builds the dense (Lq, Lk) weights that return_weights asks for"
    if callable(p.normalize):
        return "custom normalizers would see gathered rows; use the reference or chunked kernel"
    return None


def union_layout(p: Problem, bs: int) -> torch.Tensor:
    """Active blocks ``(nq, nk)`` for any batch element or head (layouts are cached on the mask)."""
    batch, heads, lq, lk, _, _ = p.sizes
    mask = p.mask if p.mask is not None else full()
    layout = mask.block_layout(lq, lk, bs, device=p.q.device, batch=batch, heads=heads)
    return layout.active.any(0).any(0)


def choose_block_size(p: Problem) -> int:
    """The block size with the fewest computed score entries (layouts are cached on the mask)."""
    def cost(bs):
        active = union_layout(p, bs)
        w = int(active.sum(1).max()) if active.numel() else 0
        return active.shape[0] * bs * max(w, 1) * bs * (1 + 16 / bs)  # per-block overhead favours larger blocks
    return min(BLOCK_SIZES, key=cost)


def gather_plan(p: Problem, bs: int):
    """Per query block, the active key blocks ``idx (nq, w)`` and which slots are real ``valid (nq, w)``."""
    active = union_layout(p, bs)
    nk = active.shape[1]
    w = max(1, int(active.sum(1).max()) if active.numel() else 1)
    key = (~active).to(torch.int64) * nk + torch.arange(nk, device=active.device)  # active blocks first, in order
    idx = torch.argsort(key, dim=1)[:, :w]
    return idx, torch.gather(active, 1, idx)


def _pad_to(t: torch.Tensor, length: int) -> torch.Tensor:
    return F.pad(t, (0, 0, 0, length - t.shape[2])) if t.shape[2] != length else t


def _slab(p: Problem, start: int, stop: int, qb, kb, vb, idx, valid, bs: int):
    """Query blocks ``start:stop``: gathered scores ``(B, H, n, bs, w*bs)`` and outputs."""
    batch, heads, lq, lk, _, _ = p.sizes
    ids = idx[start:stop]  # (n, w)
    n, w = ids.shape
    flat = ids.flatten()
    k_g = kb.index_select(2, flat).view(*kb.shape[:2], n, w * bs, kb.shape[-1])  # (B, H, n, w*bs, D)
    v_g = vb.index_select(2, flat).view(*vb.shape[:2], n, w * bs, vb.shape[-1])  # (B, H, n, w*bs, Dv)
    lane = torch.arange(bs, device=ids.device)
    kv_idx = (ids[:, :, None] * bs + lane).view(1, 1, n, 1, w * bs)
    q_idx = (torch.arange(start, stop, device=ids.device)[:, None] * bs + lane).view(1, 1, n, bs, 1)
    kv_valid = (valid[start:stop, :, None].expand(n, w, bs).reshape(1, 1, n, 1, w * bs)) & (kv_idx < lk)
    b = torch.arange(batch, device=ids.device).view(-1, 1, 1, 1, 1)
    h = torch.arange(heads, device=ids.device).view(1, -1, 1, 1, 1)
    # Padding lanes (past Lq or Lk) read the last real index: kv_valid masks them, padded rows are dropped.
    scores, allowed = block_scores(p, qb[:, :, start:stop], k_g, b, h, q_idx.clamp(max=max(lq - 1, 0)),
                                   kv_idx.clamp(max=max(lk - 1, 0)), kv_valid)
    weights, lse = block_weights(p, scores, allowed)
    out = dropout(p, weights) @ v_g  # (B, H, n, bs, Dv)
    return out, lse


def run(p: Problem) -> KernelOutput:
    q, k, v = upcast_inputs(p)
    batch, heads, lq, lk, d, dv = p.sizes
    bs = choose_block_size(p)
    idx, valid = gather_plan(p, bs)
    nq, nk = -(-lq // bs), -(-lk // bs)
    qb = _pad_to(q, nq * bs).view(batch, heads, nq, bs, d)
    kb = _pad_to(k, nk * bs).view(batch, heads, nk, bs, d)
    vb = _pad_to(v, nk * bs).view(batch, heads, nk, bs, dv)
    per_block = max(1, batch * heads * bs * idx.shape[1] * bs)
    blocks_per_slab = max(1, BUDGET // per_block)
    out, lse = run_row_chunks(lambda s, e, q_, k_, v_: _slab(p, s, e, q_, k_, v_, idx, valid, bs),
                              nq, blocks_per_slab, qb, kb, vb)
    out = out.reshape(batch, heads, nq * bs, dv)[:, :, :lq]
    lse = lse.reshape(batch, heads, nq * bs)[:, :, :lq] if lse is not None else None
    return KernelOutput(out, None, lse)
