"""Argument checks of the linear recurrences, in one place: every error names the argument, expected and actual.

The layout is attnkit's ``(B, H, L, D)`` (as :func:`attnkit.attention`); packed documents are
``(1, H, T, D)`` with ``cu_seqlens`` ``(N + 1,)`` marking where each document starts and ends.
"""

from __future__ import annotations

import itertools

import torch

from ...errors import ArgumentError, DeviceError, DTypeError, ShapeError, check_int

__all__ = ["FORMS", "check_form", "check_qkv", "check_tensor", "check_lengths", "check_state", "required_beta"]

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
