"""All-gather attention: every rank gathers the whole K/V, then attends its own queries. The simple baseline.

K/V shards are gathered (:func:`.layouts.gather`; backward: the K/V gradients are
reduce-scattered, so each shard receives the sum over ranks) and each local query
chunk runs one ``attnkit.attention`` call against the key chunks its mask can
reach (the span from the first to the last active chunk of the chunk plan; a
chunk that reaches none outputs 0, lse -inf). Every rank holds the whole K/V.

Bytes sent per rank per call, with ``b = B * H_kv * (L/W) * (D + Dv)`` elements
of itemsize s: forward ``(W - 1) * b * s`` (all-gather), backward another
``(W - 1) * b * s`` (reduce-scatter of the K/V gradients, in the input dtype).
"""

from __future__ import annotations

import torch

from .blocks import Setting, _ZeroGradient, block_attention
from .comm import Comm
from .layouts import _Gather, chunks_of

__all__ = ["allgather_attention", "bytes_sent"]


def allgather_attention(q, k, v, setting: Setting, comm: Comm, layout: str):
    """``(out, lse)`` of this rank's queries against the gathered K/V."""
    d = k.shape[-1]
    kv = _Gather.apply(torch.cat([k, v], -1), -2, layout, comm)  # (B, H_kv, L, D + Dv)
    c, outs, lses = setting.chunk, [], []
    q_chunks = chunks_of(layout, comm.rank, comm.world)
    for qc, a in zip(q.chunk(len(q_chunks), -2), q_chunks, strict=True):
        reach = [b for b, on in enumerate(setting.active[a]) if on]
        if not reach:  # kept in the graph, so this rank's backward joins the reduce-scatter too
            outs.append(_ZeroGradient.apply(qc.new_zeros(*qc.shape[:-1], v.shape[-1], dtype=v.dtype), qc, kv, kv)
                        if torch.is_grad_enabled() and kv.requires_grad else
                        qc.new_zeros(*qc.shape[:-1], v.shape[-1], dtype=v.dtype))
            lses.append(torch.full(qc.shape[:-1], float("-inf"), dtype=_lse_dtype(v), device=qc.device))
            continue
        first, last = reach[0], reach[-1] + 1
        k_span, v_span = kv[..., first * c:last * c, :].split([d, kv.shape[-1] - d], -1)
        full = all(setting.full[a][first:last])
        out, lse = block_attention(setting, qc, k_span, v_span, q0=a * c, k0=first * c, full=full)
        outs.append(out)
        lses.append(lse)
    return torch.cat(outs, -2), torch.cat(lses, -1)


def _lse_dtype(v):
    return torch.float64 if v.dtype == torch.float64 else torch.float32


def bytes_sent(*, batch, kv_heads, length, head_dim, value_dim, world, itemsize) -> int:
    """Bytes one rank sends in the forward of one call, or in its backward (the same: all-gather, reduce-scatter)."""
    block = batch * kv_heads * (length // world) * (head_dim + value_dim)
    return (world - 1) * block * itemsize
