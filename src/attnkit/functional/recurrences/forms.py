"""The three forms of one gated linear recurrence, and the driver every family function calls.

``parallel``: the whole sequence as one block (:mod:`.local`): an ``L x L`` attention matrix with the
decay mask ``exp(segsum(g))``, O(L^2) time and memory; the reference. ``chunk``: blocks of
``chunk_size`` tokens, each done in parallel, the state passed from block to block
(:func:`pass_states`): O(L c (Dk + Dv) + L Dk Dv) time, memory linear in L. ``recurrent``: one token at a
time (:mod:`.recurrent`): O(L Dk Dv) time, an O(Dk Dv) state, what decoding runs. All three
compute the same function; gradients are autograd's through the chosen form.

The argument checks every family function and the driver make (the end of this file) are here too: every
error names the argument, expected and actual. The layout is attnkit's ``(B, H, L, D)`` (as
:func:`attnkit.attention`); packed documents are ``(1, H, T, D)`` with ``cu_seqlens`` ``(N + 1,)`` marking
where each document starts and ends.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ...errors import ArgumentError, DeviceError, DTypeError, ShapeError, UnsupportedFeature, check_int
from ...masks.tree import check_parents
from .local import Local, local_terms
from .recurrent import recurrent
from .tree import tree

__all__ = ["l2_normalize", "parallel", "blocks", "through_blocks", "pass_states", "chunked", "prepare", "recurrent",
           "linear_recurrence", "gated_recurrence", "FORMS", "check_form", "check_qkv", "check_tensor", "check_lengths",
           "check_state", "required_beta"]


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(|x|^2 + eps)`` over the last dim (the eps inside the root, as flash-linear-attention)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def parallel(q, k, v, g, beta, initial, p=None, pre_decay: bool = False):
    """``o = Q^ S_0 + A (U - W S_0)`` over the whole sequence; the final state likewise (see :mod:`.local`)."""
    terms = local_terms(q, k, v, g, beta, p, pre_decay)
    written = terms.u if terms.w is None else terms.u - terms.w @ initial
    out = terms.q_from_start @ initial + terms.scores @ written
    return out, terms.decay * initial + terms.k_to_end.transpose(-1, -2) @ written


def blocks(q, k, v, g, beta, size: int, p=None, pre_decay: bool = False):
    """The :class:`~.local.Local` terms of blocks of ``size`` tokens, ``(..., C, c, D)`` (the last block padded
    with tokens that neither decay nor write)."""
    pad = (-q.shape[-2]) % size

    def split(t, dims=(0, 0)):  # (..., L, D) -> (..., C, c, D); padded only when the length asks for it
        return (F.pad(t, (*dims, 0, pad)) if pad else t).unflatten(t.dim() - 1 - len(dims) // 2, (-1, size))
    q, k, v, g = (split(t) for t in (q, k, v, g))
    beta = None if beta is None else split(beta, ())
    p = None if p is None else split(p)
    return local_terms(q, k, v, g, beta, p, pre_decay)


def through_blocks(terms, initial, n: int):
    """Outputs of the first ``n`` tokens ``(..., n, Dv)`` and the last state, the blocks entered from ``initial``."""
    entering, written, final = pass_states(initial, terms)
    out = terms.q_from_start @ entering + terms.scores @ written  # (..., C, c, Dv)
    return out.flatten(-3, -2)[..., :n, :], final


def pass_states(initial: torch.Tensor, blocks: Local):
    """States entering each block ``(..., C, Dk, Dv)``, written values ``(..., C, c, Dv)``, last state.

    ``blocks`` holds :class:`Local` terms with a block axis before the token axis (``(..., C, c, D)``);
    ``initial`` is ``(..., Dk, Dv)``.
    """
    state, entering = initial, []
    if blocks.w is None:  # nothing written depends on the state: every block's update at once
        updates = blocks.k_to_end.transpose(-1, -2) @ blocks.u  # (..., C, Dk, Dv)
        for decay, update in zip(blocks.decay.unbind(-3), updates.unbind(-3), strict=True):
            entering.append(state)
            state = decay * state + update
        return _stacked(entering, initial), blocks.u, state
    written = []  # unbind, not indexing in the loop: a slice's backward would write a full-size gradient
    for decay, k_end, u, w in zip(blocks.decay.unbind(-3), blocks.k_to_end.unbind(-3), blocks.u.unbind(-3),
                                  blocks.w.unbind(-3), strict=True):
        entering.append(state)
        written.append(u - w @ state)  # (..., c, Dv)
        state = decay * state + k_end.transpose(-1, -2) @ written[-1]
    return _stacked(entering, initial), torch.stack(written, -3) if written else blocks.u, state


def _stacked(states: list[torch.Tensor], initial: torch.Tensor) -> torch.Tensor:
    return torch.stack(states, -3) if states else initial.new_zeros(*initial.shape[:-2], 0, *initial.shape[-2:])


def chunked(q, k, v, g, beta, initial, p=None, pre_decay: bool = False, *, size: int):
    """Blocks of ``size`` tokens, each in parallel, the state passed from block to block."""
    return through_blocks(blocks(q, k, v, g, beta, size, p, pre_decay), initial, q.shape[-2])


def prepare(q, k, v, g, beta, *, scale, normalize_qk: bool, p=None):
    """The inputs in the computation's dtype (float32, float64 for float64 values), q and k normalised if asked,
    q scaled (``Dk^-1/2`` if ``scale`` is None), q/k (and ``p``) heads repeated for grouped value heads."""
    acc = torch.promote_types(v.dtype, torch.float32)
    q, k = q.to(acc), k.to(acc)
    if normalize_qk:
        q, k = l2_normalize(q), l2_normalize(k)
    q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
    p = None if p is None else p.to(acc)
    if q.shape[1] != v.shape[1]:
        q, k, p = (None if t is None else t.repeat_interleave(v.shape[1] // t.shape[1], 1) for t in (q, k, p))
    return q, k, v.to(acc), g.to(acc), None if beta is None else beta.to(acc), p


def linear_recurrence(who: str, q, k, v, g, beta, *, scale, normalize_qk: bool, form: str, chunk_size: int,
                      initial_state, cu_seqlens, parents=None, p=None, pre_decay: bool = False):
    """Run the recurrence on checked ``q, k`` ``(B, Hk, L, Dk)``, ``v`` ``(B, H, L, Dv)``, log decays ``g``
    ``(B, H, L, G)``, ``beta`` ``(B, H, L)`` or None, ``p`` ``(B, Hk, L, Dk)`` the keys the delta rule's
    correction reads (None: ``k``; used as given, neither normalised nor scaled), ``pre_decay`` whether it reads
    the state before the token's decay (the generalized delta rule); returns
    ``(out (B, H, L, Dv), final (N, H, Dk, Dv))``.

    Computed in float32 (float64 for float64 values); the output in ``v``'s dtype, the state in the
    computation's. ``q, k`` heads serve ``H / Hk`` consecutive value heads each.

    ``parents`` ``(L,)`` or ``(B, L)`` (:func:`attnkit.masks.tree`'s): the ``L`` tokens are the nodes of a draft
    tree, run in the tree form (:mod:`.tree`; ``form`` is not used), each from its parent's state; the second
    result is then every node's state ``(B, H, L, Dk, Dv)``.
    """
    check_form(who, form, chunk_size)
    if parents is not None:
        if p is not None or pre_decay:
            raise UnsupportedFeature(f"{who}: parents (a draft tree) take the delta rule with its own keys; a "
                                     "correction key p or a pre-decay read is not supported")
        return _tree(who, q, k, v, g, beta, scale=scale, normalize_qk=normalize_qk, initial_state=initial_state,
                     cu_seqlens=cu_seqlens, parents=parents)
    b, h, n, dk, dv = (*v.shape[:3], q.shape[-1], v.shape[-1])
    lengths = check_lengths(who, cu_seqlens, b, n)
    docs = b if lengths is None else len(lengths)
    initial = check_state(who, initial_state, (docs, h, dk, dv), q.device)
    q, k, vv, g, beta, p = prepare(q, k, v, g, beta, scale=scale, normalize_qk=normalize_qk, p=p)
    initial = vv.new_zeros(docs, h, dk, dv) if initial is None else initial.to(vv.dtype)
    forms: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {
        "parallel": parallel, "chunk": functools.partial(chunked, size=chunk_size), "recurrent": recurrent}
    run = functools.partial(forms[form], pre_decay=pre_decay)
    if n == 0:  # no token: the empty output joined to every input by an empty sum (zero gradients, not None)
        return (vv + sum(t.sum() for t in (q, k, g, beta, p) if t is not None)).to(v.dtype), initial
    if lengths is None:
        out, final = run(q, k, vv, g, beta, initial, p)
        return out.to(v.dtype), final
    outs, finals = [], []
    nothing = (None,) * len(lengths)
    pieces = zip(*(t.split(lengths, 2) for t in (q, k, vv, g)), nothing if beta is None else beta.split(lengths, 2),
                 initial.split(1), nothing if p is None else p.split(lengths, 2), strict=True)
    for qd, kd, vd, gd, bd, sd, pd in pieces:
        out, final = run(qd, kd, vd, gd, bd, sd, pd) if qd.shape[2] else (vd, sd)
        outs.append(out)
        finals.append(final)
    return torch.cat(outs, 2).to(v.dtype), torch.cat(finals)


def _tree(who, q, k, v, g, beta, *, scale, normalize_qk, initial_state, cu_seqlens, parents):
    """:func:`linear_recurrence` over the nodes of a draft tree (see there)."""
    if cu_seqlens is not None:
        raise ArgumentError(f"{who}: parents (a draft tree) and cu_seqlens (packed documents) exclude each other; "
                            "got both")
    b, h, n, dk, dv = (*v.shape[:3], q.shape[-1], v.shape[-1])
    parents = check_parents(who, parents)
    if parents.shape[-1] != n or (parents.dim() == 2 and parents.shape[0] not in (1, b)):
        raise ShapeError(f"{who}: parents must have shape ({n},) or ({b}, {n}) (one parent per token); got "
                         f"{tuple(parents.shape)}")
    initial = check_state(who, initial_state, (b, h, dk, dv), q.device)
    q, k, vv, g, beta, _ = prepare(q, k, v, g, beta, scale=scale, normalize_qk=normalize_qk)
    initial = vv.new_zeros(b, h, dk, dv) if initial is None else initial.to(vv.dtype)
    out, states = tree(q, k, vv, g, beta, initial, parents.reshape(-1, n).expand(b, n))
    return out.to(v.dtype), states


def gated_recurrence(who: str, q, k, v, g=None, beta=None, *, per_channel: bool = False, **options):
    """:func:`linear_recurrence` after checking ``q, k, v``, the log decays ``g`` (``(B, H, L)``, or ``(B, H, L, Dk)``
    with ``per_channel``; None: no decay) and ``beta`` ``(B, H, L)`` (None: no delta rule) against them."""
    b, h, n, dk, _ = check_qkv(who, q, k, v)
    if g is None:
        g = v.new_zeros(b, h, n, 1)
    elif per_channel:
        check_tensor(who, "g", g, (b, h, n, dk), "(B, H, L, Dk)", q.device)
    else:
        g = check_tensor(who, "g", g, (b, h, n), "(B, H, L)", q.device)[..., None]
    if beta is not None:
        check_tensor(who, "beta", beta, (b, h, n), "(B, H, L)", q.device)
    return linear_recurrence(who, q, k, v, g, beta, **options)


# ------------------------------------------------------------------ argument checks
FORMS = ("parallel", "chunk", "recurrent")


def check_form(who: str, form, chunk_size) -> str:
    """``form`` one of :data:`FORMS`; ``chunk_size`` an int >= 1."""
    if form not in FORMS:
        raise ArgumentError(f"{who}: form must be one of {FORMS}; got {form!r}")
    if type(chunk_size) is not int or chunk_size < 1:  # a plain int >= 1 passes without the shared check's call
        check_int(who, "chunk_size", chunk_size, 1)
    return form


def required_beta(who: str, beta):
    """``beta``, which the delta rule needs (None is the plain recurrence: another function)."""
    if beta is None:
        raise ArgumentError(f"{who}: beta (B, H, L) is required; got None")
    return beta


def _floating(who: str, name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        raise DTypeError(f"{who}: {name} must be a floating tensor; got {got}")
    return t


def check_qkv(who: str, q, k, v, names=("q", "k", "v")) -> tuple[int, int, int, int, int]:
    """``q, k`` ``(B, Hk, L, Dk)`` and ``v`` ``(B, H, L, Dv)`` of one dtype and device, ``H % Hk == 0``.

    Returns ``(B, H, L, Dk, Dv)``.
    """
    for name, t in zip(names, (q, k, v), strict=True):
        _floating(who, name, t)
        if t.dim() != 4:
            raise ShapeError(f"{who}: {name} must have shape (B, H, L, D); got {tuple(t.shape)}")
    if k.shape != q.shape:
        raise ShapeError(f"{who}: {names[1]} must have the shape of {names[0]} {tuple(q.shape)}; got {tuple(k.shape)}")
    b, hk, n, dk = q.shape
    h = v.shape[1]
    if v.shape[0] != b or v.shape[2] != n or h < 1 or h % max(hk, 1):
        raise ShapeError(f"{who}: {names[2]} must have shape (B, H, L, Dv) = ({b}, a multiple of {hk}, {n}, Dv); "
                         f"got {tuple(v.shape)}")
    for name, t in zip(names[1:], (k, v), strict=True):
        if t.dtype != q.dtype:
            raise DTypeError(f"{who}: {name} must have {names[0]}'s dtype {q.dtype}; got {t.dtype}")
        if t.device != q.device:
            raise DeviceError(f"{who}: {name} must be on {names[0]}'s device {q.device}; got {t.device}")
    return b, h, n, dk, v.shape[-1]


def check_tensor(who: str, name: str, t, shape: tuple[int, ...], dims: str, device) -> torch.Tensor:
    """A floating tensor of exactly ``shape`` on ``device`` (any floating dtype: it is computed in float32+)."""
    _floating(who, name, t)
    if tuple(t.shape) != tuple(shape):
        raise ShapeError(f"{who}: {name} must have shape {dims} = {tuple(shape)}; got {tuple(t.shape)}")
    if t.device != device:
        raise DeviceError(f"{who}: {name} must be on {device}; got {t.device}")
    return t


def check_lengths(who: str, cu_seqlens, batch: int, length: int) -> list[int] | None:
    """The document lengths of ``cu_seqlens`` (None passes): an int tensor ``0 = c_0 <= c_1 <= ... = L``, B = 1."""
    if cu_seqlens is None:
        return None
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype not in (torch.int32, torch.int64):
        got = cu_seqlens.dtype if isinstance(cu_seqlens, torch.Tensor) else type(cu_seqlens).__name__
        raise DTypeError(f"{who}: cu_seqlens must be an int32 or int64 tensor; got {got}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ShapeError(f"{who}: cu_seqlens must have shape (N + 1,) with N >= 1 documents; got "
                         f"{tuple(cu_seqlens.shape)}")
    if batch != 1:
        raise ShapeError(f"{who}: packed documents (cu_seqlens) need batch 1, shape (1, H, T, D); got batch {batch}")
    bounds = [int(c) for c in cu_seqlens.tolist()]
    steps = [b - a for a, b in itertools.pairwise(bounds)]
    if bounds[0] != 0 or bounds[-1] != length or min(steps) < 0:
        raise ArgumentError(f"{who}: cu_seqlens must rise from 0 to the length T = {length} without falling; "
                            f"got {bounds}")
    return steps


def check_state(who: str, state, shape: tuple[int, int, int, int], device) -> torch.Tensor | None:
    """``initial_state`` ``(N, H, Dk, Dv)`` (N = batch, or documents when packed); None passes."""
    if state is None:
        return None
    return check_tensor(who, "initial_state", state, shape, "(N, H, Dk, Dv)", device)
