"""Linear (feature-map) attention over a sequence split across ranks: the running state by an exclusive prefix scan.

Causal feature-map attention (Katharopoulos et al. 2020, arXiv:2006.16236, Sec. 3.3; the
Performer's FAVOR+, Choromanski et al. 2021, arXiv:2009.14794) carries a state per head::

    S_c = sum_{j in chunk c} phi(k_j) v_j^T      z_c = sum_{j in chunk c} phi(k_j)
    out_i = (phi(q_i)^T (P_c + local_i)) / (phi(q_i)^T (Z_c + zlocal_i) + eps),  P_c = sum_{c' < c} S_c'

Each rank computes the states of its chunks, one all-gather gives every rank all chunk
states (``W`` or ``2W`` of them, ``O(f dv)`` each whatever L), and each rank sums the
ones before its chunks (an exclusive prefix scan in one round instead of W - 1
sequential hops). Inside a chunk the sums are the one-process causal ones
(:func:`attnkit.nn.linear.causal_sums`). Non-causal: every chunk sees the total. The
all-gather's backward reduce-scatters the state gradients, so ``.grad`` of each shard is
the gradient of the sum of all ranks' losses.

As one process does, :func:`sequence_parallel` clears NaN and inf at padded positions before
the projections (:mod:`attnkit.nn.padding`), so they reach no output at a real position and no
gradient. Every call starts with the agreement check of :mod:`.agreement`; a global length of 0
gives an empty output.

Bytes sent per rank per call: ``(W - 1) * m * B * H * f * (dv + 1) * itemsize``
(``m`` chunks per rank: 1 contiguous, 2 zigzag; itemsize of float32, or float64), the
same in the backward; the Performer adds an all-reduce of one max per (sample, head).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..errors import DTypeError, ShapeError
from ..nn.linear import LinearAttention, PerformerAttention, accumulate_dtype, causal_sums, check_keep_mask
from ..nn.padding import clear_padding
from .agreement import Field, checked, layer_fields, size, text_of
from .comm import Comm
from .layouts import _Gather, chunks_of
from .layouts import chunk_size as layout_chunk

__all__ = ["feature_attention", "sequence_parallel"]


def feature_attention(phi_q, phi_k, v, *, causal: bool = True, eps: float = 0.0, chunk_size: int = 64,
                      layout: str = "contiguous", group=None):
    """Feature-map attention of this rank's shards ``(B, H, L/W, f)``, ``(B, H, L/W, f)``, ``(B, H, L/W, dv)``.

    Equal to :func:`attnkit.nn.linear.feature_map_attention` on the full tensors, sharded by ``layout``.
    """
    comm = Comm(group)
    shapes = ", ".join(str(tuple(getattr(t, "shape", ()))) for t in (phi_q, phi_k, v))
    checked(comm, "attnkit.distributed.linear.feature_attention",
            lambda: layout_chunk(phi_q.shape[-2] * comm.world, layout, comm.world, "the global length L = W * shard "
                                 "length"),
            [Field("the shard length (phi_q.shape[-2])", size(phi_q, -2), ShapeError),
             Field("the shapes of phi_q, phi_k, v", shapes, ShapeError),
             Field("v.dtype", text_of(getattr(v, "dtype", None)), DTypeError),
             Field("causal", int(bool(causal))), Field("layout", repr(layout))], device=getattr(v, "device", None))
    return _scan(phi_q, phi_k, v, causal, eps, chunk_size, layout, comm)


def _scan(phi_q, phi_k, v, causal, eps, chunk_size, layout, comm: Comm):
    """The state exchange and the outputs of :func:`feature_attention`, once every rank agrees."""
    if phi_q.shape[-2] == 0:  # every rank holds no position (they agreed): an empty output, nothing to send
        return v.clone()
    acc = accumulate_dtype(v.dtype)
    pieces = len(chunks_of(layout, comm.rank, comm.world))
    qs, ks, vs = (t.to(acc).chunk(pieces, -2) for t in (phi_q, phi_k, v))
    states = torch.stack([torch.cat([k.transpose(-1, -2) @ vv, k.sum(-2).unsqueeze(-1)], -1)
                          for k, vv in zip(ks, vs, strict=True)])  # (pieces, B, H, f, dv + 1)
    every = _Gather.apply(states, 0, layout, comm)  # (chunks, B, H, f, dv + 1), global order
    before = every.cumsum(0) - every if causal else every.sum(0, keepdim=True).expand_as(every)
    dv, outs = v.shape[-1], []
    for q, k, vv, a in zip(qs, ks, vs, chunks_of(layout, comm.rank, comm.world), strict=True):
        num, den = q @ before[a][..., :dv], q @ before[a][..., dv:]
        if causal:
            local_num, local_den = causal_sums(q, k, vv, chunk_size)
            num, den = num + local_num, den + local_den
        den = den + eps
        outs.append(num / torch.where(den > 0, den, torch.ones_like(den)))
    return torch.cat(outs, -2).to(v.dtype)


def _performer_features(layer: PerformerAttention, q, k, keep, comm: Comm):
    """Query features per row (as one process); key features against the global max logit (all-reduced)."""
    lq, lk = layer._logits(q), layer._logits(k)
    phi_q = layer._features(lq, layer._reference(lq.amax(-1, keepdim=True)))
    seen = lk if keep is None else lk.masked_fill(~keep, -math.inf)
    top = comm.all_reduce_max(seen.detach().amax((-1, -2), keepdim=True))
    phi_k = layer._features(lk, layer._reference(top))  # the one stabiliser cancels in the ratio
    return phi_q, phi_k if keep is None else phi_k.masked_fill(~keep, 0.0), 0.0


def _linear_features(layer: LinearAttention, q, k, keep, comm: Comm):
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    return phi_q, phi_k if keep is None else phi_k.masked_fill(~keep, 0.0), layer.eps


def sequence_parallel(layer, x, *, key_keep_mask=None, layout: str = "contiguous", group=None):
    """``layer(x_full)``'s shard, from this rank's shard ``x`` ``(b, L/W, dim)`` of the sequence.

    ``layer`` is a :class:`~attnkit.nn.LinearAttention` or :class:`~attnkit.nn.PerformerAttention`
    (causal or not); ``key_keep_mask`` is this rank's shard ``(b, L/W)`` of the keep mask.
    Parameter gradients are this rank's share: sum them over ranks (as DDP does).
    """
    comm = Comm(group)
    keep = checked(comm, "attnkit.distributed.linear.sequence_parallel",
                   lambda: _check_call(layer, x, key_keep_mask, layout, comm.world),
                   layer_fields(layer, x, key_keep_mask, layout), device=getattr(x, "device", None))
    if x.shape[1] == 0:  # as one process: an empty sequence has an empty output, and no rank has anything to send
        return layer(x, key_keep_mask=key_keep_mask)
    q, k, v = layer.project(clear_padding(x, keep))  # (b, h, n, d) each
    keep = None if keep is None else keep[:, None, :, None]
    if keep is not None:
        v = v.masked_fill(~keep, 0.0)
    acc = accumulate_dtype(x.dtype)
    phi_q, phi_k, eps = _FEATURES[type(layer)](layer, q.to(acc), k.to(acc), keep, comm)
    return layer.merge_heads(_scan(phi_q, phi_k, v, layer.causal, eps, layer.chunk_size, layout, comm))


def _check_call(layer, x, key_keep_mask, layout: str, world: int):
    """This rank's checks of a :func:`sequence_parallel` call (no communication); the keep mask checked."""
    if type(layer) not in _FEATURES:
        raise DTypeError(f"sequence_parallel takes a LinearAttention or PerformerAttention; got {type(layer).__name__}")
    layer.check_input(x)
    layout_chunk(x.shape[1] * world, layout, world, "the global length L = W * x.shape[1]")
    return check_keep_mask(type(layer).__name__, "key_keep_mask", key_keep_mask, x.shape[0], x.shape[1])


_FEATURES = {LinearAttention: _linear_features, PerformerAttention: _performer_features}
