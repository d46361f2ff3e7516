"""Linear recurrences with decays, gates and the delta rule over a sequence split across ranks: a prefix scan of maps.

Every run of tokens maps the state it is entered with to the state it leaves with, affinely::

    S -> M S + N      M = diag(exp(sum of the log decays))   (no delta rule: sent as its diagonal)
                      M = a Dk x Dk matrix                   (delta rule: products of (I - beta k k^T) and decays)
                      N = the state left when entered with zeros

(:func:`attnkit.functional.recurrences.scan.span_map`). Each rank computes the map of each of its pieces
of the sequence (1 piece contiguous, 2 zigzag) from its own tokens, one all-gather hands every rank
every piece's map (a size that does not depend on L), and each rank folds the maps of the pieces
before its own onto the initial state: the state each of its pieces is entered with, exactly the
one-process one. Its pieces then run the chunk form from those states, so outputs, the final state
(the fold of all maps, on every rank) and gradients equal one process's. The all-gather's backward
reduce-scatters the maps' gradients to the ranks that made them; parameter and ``initial_state``
gradients are each rank's share, to be summed over ranks (as DDP does).

Bytes sent per rank per call: ``(W - 1) m B H Dk (Dk + Dv) itemsize`` with the delta rule,
``(W - 1) m B H Dk (1 + Dv) itemsize`` without (m pieces per rank; itemsize of float32, or float64),
the same in the backward; layers with a short convolution of kernel K add an all-gather of each
piece's last ``K - 1`` input rows (``(W - 1) m B (K - 1) (dim + 1) itemsize``), the context of the
next piece's convolution.
"""

from __future__ import annotations

import torch

from ..errors import DTypeError, ShapeError, check_int
from ..functional.recurrences.forms import (
    blocks,
    check_qkv,
    check_state,
    check_tensor,
    linear_recurrence,
    pass_states,
    prepare,
    through_blocks,
)
from ..functional.recurrences.scan import span_map
from ..nn._inputs import check_keep_mask, check_sequence
from ..nn._recurrent import RecurrentLayer
from .agreement import Field, checked, layer_fields, size, text_of, tracked
from .comm import Comm
from .layouts import _Gather, chunks_of
from .layouts import chunk_size as layout_chunk

__all__ = ["recurrence", "sequence_parallel"]


def recurrence(q, k, v, g, beta=None, *, scale=None, normalize_qk: bool = False, initial_state=None,
               chunk_size: int = 64, layout: str = "contiguous", group=None):
    """This rank's shard of :func:`attnkit.functional.recurrences.forms.linear_recurrence` over the whole sequence.

    The generic recurrence every function of :mod:`attnkit.functional.recurrences` runs: ``g`` ``(B, H, L/W, 1)``
    (a log decay per head, as ``retention``, ``ssd``, ``gated_delta_rule``) or ``(B, H, L/W, Dk)`` (per
    key channel, as ``gated_linear_attention``, ``kimi_delta_attention``), zeros for none (``delta_rule``);
    ``beta`` ``(B, H, L/W)`` for the delta rule, None without. ``q, k`` ``(B, Hk, L/W, Dk)``, ``v`` ``(B, H,
    L/W, Dv)`` are this rank's shards in ``layout``; ``initial_state`` ``(B, H, Dk, Dv)`` the state before
    the first token (the same on every rank). Returns ``(out shard (B, H, L/W, Dv), final state)``.
    """
    comm = Comm(group)
    initial = checked(comm, "attnkit.distributed.recurrence",
                      lambda: _check_recurrence(q, k, v, g, beta, initial_state, chunk_size, layout, comm.world), [
        Field("the shard length (q.shape[2])", size(q, 2), ShapeError),
        Field("the shapes of q, k, v, g and beta", " ".join(str(tuple(getattr(t, "shape", ()))) for t in
                                                            (q, k, v, g, beta)), ShapeError),
        Field("q.dtype", text_of(getattr(q, "dtype", None)), DTypeError),
        Field("the initial state's shape", str(tuple(getattr(initial_state, "shape", ()))), ShapeError),
        Field("scale", repr(scale)), Field("normalize_qk", repr(normalize_qk)), Field("chunk_size", repr(chunk_size)),
        Field("layout", repr(layout)), tracked(q, k, v, g, beta, initial_state)], device=getattr(q, "device", None))
    if q.shape[2] == 0:  # every rank holds no position (they agreed): as one process, nothing to send
        return linear_recurrence("distributed.recurrence", q, k, v, g, beta, scale=scale, normalize_qk=normalize_qk,
                                 form="chunk", chunk_size=chunk_size, initial_state=initial, cu_seqlens=None)
    pieces = len(chunks_of(layout, comm.rank, comm.world))
    prepared = prepare(q, k, v, g, beta, scale=scale, normalize_qk=normalize_qk)
    parts = list(zip(*(t.chunk(pieces, 2) for t in prepared[:4]),
                     (None,) * pieces if beta is None else prepared[4].chunk(pieces, 2), strict=True))
    outs, final = across_ranks(parts, initial, chunk_size, layout, comm)
    return torch.cat(outs, 2).to(v.dtype), final


def _check_recurrence(q, k, v, g, beta, initial_state, chunk_size, layout: str, world: int):
    """This rank's checks of a :func:`recurrence` call (no communication); the initial state checked."""
    who = "distributed.recurrence"
    b, h, m, dk, dv = check_qkv(who, q, k, v)
    gates = g.shape[-1] if isinstance(g, torch.Tensor) and g.dim() == 4 and g.shape[-1] == dk else 1
    check_tensor(who, "g", g, (b, h, m, gates), "(B, H, L/W, 1 or Dk)", q.device)
    if beta is not None:
        check_tensor(who, "beta", beta, (b, h, m), "(B, H, L/W)", q.device)
    check_int(who, "chunk_size", chunk_size, 1)
    layout_chunk(m * world, layout, world, "the global length L = W * shard length")
    return check_state(who, initial_state, (b, h, dk, dv), q.device)


def _piece_map(terms, delta: bool) -> torch.Tensor:
    """``[M | N]`` ``(B, H, Dk, Dk + Dv)`` of a piece's blocks; without the delta rule ``[diag(M) | N]``."""
    if delta:
        return torch.cat(span_map(terms), -1)
    dk, dv = terms.k_to_end.shape[-1], terms.u.shape[-1]
    zeros = terms.u.new_zeros(*terms.u.shape[:-3], dk, dv)
    decay = terms.decay.prod(-3).expand(*terms.decay.shape[:-3], dk, 1)  # the blocks' decays, multiplied
    return torch.cat([decay, pass_states(zeros, terms)[2]], -1)


def across_ranks(pieces, initial, chunk_size: int, layout: str, comm: Comm):
    """Outputs of this rank's ``pieces`` (prepared ``(q, k, v, g, beta)`` each, in shard order) and the final state."""
    terms = [blocks(*piece, chunk_size) for piece in pieces]
    delta = pieces[0][4] is not None
    q, v = pieces[0][0], pieces[0][2]
    dk, dv = q.shape[-1], v.shape[-1]
    every = _Gather.apply(torch.stack([_piece_map(t, delta) for t in terms]), 0, layout, comm)  # global order
    state = v.new_zeros(v.shape[0], v.shape[1], dk, dv) if initial is None else initial.to(v.dtype)
    entering = []
    for piece_map in every.unbind(0):
        entering.append(state)
        m, n = piece_map.split([piece_map.shape[-1] - dv, dv], -1)
        state = (m @ state if delta else m * state) + n
    # Every rank's backward must join the maps' reduce-scatter, also a rank whose pieces need no earlier map (the
    # first piece): an exact zero in the graph of the gathered maps.
    link = every[..., :0].sum()
    outs = [through_blocks(t, entering[a], piece[0].shape[2])[0] + link
            for t, piece, a in zip(terms, pieces, chunks_of(layout, comm.rank, comm.world), strict=True)]
    return outs, state


def _contexts(layer: RecurrentLayer, xs, keeps, layout: str, comm: Comm):
    """Each piece's short-convolution context, the last ``K - 1`` rows of the piece before it (gathered), and an
    exact zero in the graph of the gathered rows (see :func:`across_ranks`)."""
    conv = getattr(layer, "conv1d", None)
    width = 0 if conv is None else conv.weight.shape[-1] - 1
    if width == 0:
        return [None] * len(xs), 0.0
    if xs[0].shape[1] < width:
        raise ShapeError(f"sequence_parallel: each piece of the sequence must hold at least the convolution's "
                         f"kernel - 1 = {width} tokens; got {xs[0].shape[1]}")
    tails = torch.stack([torch.cat([x[:, -width:], (kp[:, -width:, None] if kp is not None else
                                                    torch.ones_like(x[:, -width:, :1])).to(x.dtype)], -1)
                         for x, kp in zip(xs, keeps, strict=True)])  # (pieces, B, K - 1, dim + 1)
    every = _Gather.apply(tails, 0, layout, comm)
    return [None if a == 0 else layer.conv_context(every[a - 1][..., :-1], every[a - 1][..., -1] > 0.5)
            for a in chunks_of(layout, comm.rank, comm.world)], every[..., :0].sum()


def sequence_parallel(layer, x, *, key_keep_mask=None, layout: str = "contiguous", group=None):
    """``layer(x_full)``'s shard, from this rank's shard ``x`` ``(b, L/W, dim)`` of the sequence.

    ``layer`` is one of the linear-recurrent layers (:class:`~attnkit.nn.RetNetRetention`,
    :class:`~attnkit.nn.GatedLinearAttention`, :class:`~attnkit.nn.Mamba2Mixer`, :class:`~attnkit.nn.DeltaNet`,
    :class:`~attnkit.nn.GatedDeltaNet`, :class:`~attnkit.nn.KimiDeltaAttention`); ``key_keep_mask`` is this
    rank's shard ``(b, L/W)`` of the keep mask. Rotary positions continue at each piece's global
    position. Parameter gradients are this rank's share: sum them over ranks (as DDP does).
    """
    if not isinstance(layer, RecurrentLayer):  # the same code on every rank: refused before any collective
        raise DTypeError(f"sequence_parallel takes a linear-recurrent layer (RetNetRetention, GatedLinearAttention, "
                         f"Mamba2Mixer, DeltaNet, GatedDeltaNet, KimiDeltaAttention); got {type(layer).__name__}")
    layer.check_one_step_a_token("sequence_parallel (pieces across ranks; run it on one process)")
    comm = Comm(group)
    keep = checked(comm, "attnkit.distributed.recurrences.sequence_parallel",
                   lambda: _check_layer_call(layer, x, key_keep_mask, layout, comm.world),
                   layer_fields(layer, x, key_keep_mask, layout), device=getattr(x, "device", None))
    if x.shape[1] == 0:  # as one process: an empty sequence has an empty output, and no rank has anything to send
        return layer(x, key_keep_mask=key_keep_mask)
    piece = layout_chunk(x.shape[1] * comm.world, layout, comm.world)
    if keep is not None:
        x = x.masked_fill(~keep[..., None], 0.0)
    xs = x.split(piece, 1)
    keeps = (None,) * len(xs) if keep is None else keep.split(piece, 1)
    ids = chunks_of(layout, comm.rank, comm.world)
    contexts, link = _contexts(layer, xs, keeps, layout, comm)
    mixed = [layer.inert(layer._mix(xp, kp, context, a * piece)[0], kp)
             for xp, kp, context, a in zip(xs, keeps, contexts, ids, strict=True)]
    prepared = [prepare(mx.q, mx.k, mx.v, mx.g, mx.beta, scale=layer.scale, normalize_qk=layer.normalize_qk)[:5]
                for mx in mixed]  # (q, k, v, g, beta): a correction key is not taken across ranks
    outs, _ = across_ranks(prepared, None, layer.chunk_size, layout, comm)
    ys = [layer._finish(out.to(mx.v.dtype), mx, xp) for out, mx, xp in zip(outs, mixed, xs, strict=True)]
    return torch.cat(ys, 1) + link


def _check_layer_call(layer, x, key_keep_mask, layout: str, world: int):
    """This rank's checks of a :func:`sequence_parallel` call (no communication); the keep mask checked."""
    check_sequence(type(layer).__name__, "x", x, layer.dim, like=layer)
    layout_chunk(x.shape[1] * world, layout, world, "the global length L = W * shard length")
    return check_keep_mask(type(layer).__name__, "key_keep_mask", key_keep_mask, x.shape[0], x.shape[1])
