"""Tree attention for decoding: the KV cache split over the ranks, the queries on every rank, two all-reduces.

Shyam et al. 2024, "Tree Attention: Topology-aware Decoding for Long-Context Attention
on GPU clusters" (arXiv:2408.04093, Sec. 4): softmax attention over keys split into parts
is a reduction of each part's ``(out_r, lse_r)``, and a reduction runs as an all-reduce
(a tree, or whatever the backend does best) instead of W - 1 ring steps::

    m   = max_r lse_r                                    (all-reduce max: the stabiliser)
    s   = sum_r exp(lse_r - m)                           \\ one all-reduce sum of
    num = sum_r exp(lse_r - m) * out_r                   /  [num, s] together
    out = num / s,   lse = m + log s

Each rank holds the queries of the step, ``(B, H, Lq, D)`` (the same on every rank), and
its shard of the cache, ``(B, H_kv, L/W, D)`` under ``layout``; every rank gets the whole
output. The mask and bias are given for the global ``Lq x L`` problem (a decoding step's
queries are its last rows: bottom-right alignment) and read at each chunk's global key
positions (:func:`attnkit.masks.shifted`). A row no key allows anywhere gets 0 and lse
``-inf`` (``s = 0``), never ``0 / 0``.

Differentiable: the stabiliser ``m`` cancels in ``out`` and ``lse`` (no gradient flows
through it) and the sum's backward is the sum of the ranks' gradients, so, as for every
scheme, each rank's ``.grad`` is its share of the gradient of the sum of all ranks' losses.

Bytes sent per rank and call (a ring all-reduce of n bytes sends ``2 (W - 1) / W n``):
``2 (W - 1) / W * B H Lq (4|8) * (1 + Dv + 1)`` (the max, then ``[num, s]``), whatever L.
"""

from __future__ import annotations

import torch

from ..core import attention as local_attention
from ..functional.shifted import shift_modifier
from ..masks import shifted
from .blocks import Setting
from .comm import Comm
from .layouts import chunks_of
from .merge import merge, weight

__all__ = ["tree_attention", "bytes_sent"]


class _SumOverRanks(torch.autograd.Function):
    """The all-reduced sum; its backward all-reduces the gradients (each rank's loss reads the replicated sum)."""

    @staticmethod
    def forward(ctx, t, comm):
        ctx.comm = comm
        return comm.all_reduce_sum(t)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.all_reduce_sum(grad), None


def _local(q, k, v, s: Setting, comm: Comm, layout: str):
    """``(out, lse)`` of the queries against this rank's chunks of the cache, merged (lse dtype)."""
    lq, c = q.shape[-2], s.chunk
    acc = None
    for kc, vc, chunk in zip(k.chunk(len(chunks_of(layout, 0, comm.world)), -2),
                             v.chunk(len(chunks_of(layout, 0, comm.world)), -2),
                             chunks_of(layout, comm.rank, comm.world), strict=True):
        k0 = chunk * c
        bias = (s.bias[..., k0:k0 + c] if isinstance(s.bias, torch.Tensor) else
                shift_modifier(s.bias, k0=k0, q_len=lq, kv_len=s.length))
        part = local_attention(q, kc, vc, mask=shifted(s.mask, k0=k0, q_len=lq, kv_len=s.length), bias=bias,
                               scale=s.scale, return_lse=True)
        acc = merge(acc, (part.output, part.lse))
    return acc


def tree_attention(q, k, v, setting: Setting, comm: Comm, layout: str):
    """``(out, lse)`` of the queries against the whole cache, the same on every rank."""
    out, lse = _local(q, k, v, setting, comm, layout)
    top = comm.all_reduce_max(lse.detach())
    share = weight(lse, top)  # exp(lse - m), 0 for a rank whose chunks allow nothing
    total = _SumOverRanks.apply(torch.cat([share.unsqueeze(-1) * out, share.unsqueeze(-1)], -1), comm)
    num, s = total[..., :-1], total[..., -1]
    empty = s == 0
    out = num / torch.where(empty, torch.ones_like(s), s).unsqueeze(-1)
    finite_top = torch.where(top == float("-inf"), torch.zeros_like(top), top)
    lse = torch.where(empty, torch.full_like(s, float("-inf")), finite_top + torch.log(s.masked_fill(empty, 1.0)))
    return out.to(v.dtype), lse


def bytes_sent(*, batch, heads, q_len, value_dim, world, lse_itemsize, backward=False) -> int:
    """Bytes one rank sends in one call: the max and the sum forward, the sum's gradient backward."""
    rows = batch * heads * q_len * lse_itemsize
    summed = 2 * (world - 1) * rows * (value_dim + 1) // world
    return summed if backward else 2 * (world - 1) * rows // world + summed
