"""What a mask picture shows, computed without an Lq x Lk tensor: element view and block states.

The element view evaluates the mask's predicate directly at index grids, never
through an ``Lq x Lk`` tensor beyond ``_DENSE_LIMIT`` entries: up to 512 x 512 it
is exact, one cell per entry; above that each drawn cell shows the fraction of
allowed entries in it, computed from every entry while ``Lq * Lk <= _DENSE_LIMIT``
(16M) and from a 4 x 4 grid of sample points per cell beyond (the block overlay,
which is computed without materialising anything, then still shows every active
block, including thin features the samples may miss).
"""

from __future__ import annotations

import math

import torch

from ...errors import ArgumentError, DTypeError, ShapeError, check_int
from ...masks import TensorMask, parse
from ...masks.base import Mask

__all__ = ["as_mask", "element_view", "block_states", "element_fraction"]

_DENSE_LIMIT = 1 << 24
_RESOLUTION = 512
_SAMPLES = 4
_BAND = 1 << 20


def as_mask(mask, q_len: int, kv_len: int | None) -> tuple[Mask, int]:
    """(Mask, kv_len) from a Mask, a 2-D bool tensor or a mask expression string."""
    check_int("mask_picture", "q_len", q_len, 1)
    if isinstance(mask, str):
        mask = parse(mask)
    elif isinstance(mask, torch.Tensor):
        if mask.dtype != torch.bool:
            raise DTypeError(f"mask_picture: a tensor mask must be bool (True = attend); got {mask.dtype}")
        kv_len = mask.shape[-1] if kv_len is None and mask.dim() == 2 else kv_len
        if mask.dim() != 2 or tuple(mask.shape) != (q_len, kv_len):
            raise ShapeError(f"mask_picture: mask must have shape (q_len, kv_len) = ({q_len}, {kv_len}); "
                             f"got {tuple(mask.shape)}")
        mask = TensorMask(mask[None, None])
    elif not isinstance(mask, Mask):
        raise DTypeError(f"mask_picture: mask must be an attnkit mask, a bool tensor or an expression string; "
                         f"got {type(mask).__name__}")
    kv_len = q_len if kv_len is None else check_int("mask_picture", "kv_len", kv_len, 1)
    for name, fixed, given in (("q_len", mask.q_len, q_len), ("kv_len", mask.kv_len, kv_len)):
        if fixed is not None and fixed != given:
            raise ArgumentError(f"mask_picture: the mask is for {name} = {fixed}; got {name} = {given}")
    return mask, kv_len


def _samples(length: int, dense: bool) -> tuple[int, int, torch.Tensor, torch.Tensor]:
    """(cell factor f, sample points per cell s, indices (cells*s,), in-range flags)."""
    f = math.ceil(length / _RESOLUTION)
    cells = math.ceil(length / f)
    s = f if dense else min(f, _SAMPLES)
    offsets = torch.arange(f) if s == f else ((torch.arange(s) + 0.5) * f / s).long()
    idx = (torch.arange(cells)[:, None] * f + offsets[None, :]).flatten()
    return f, s, idx.clamp(max=length - 1), idx < length


def element_view(mask: Mask, q_len: int, kv_len: int) -> tuple[torch.Tensor, int, int]:
    """(fraction allowed per drawn cell, query cell size, key cell size) for sample 0, head 0."""
    dense = q_len * kv_len <= _DENSE_LIMIT
    fq, sq, qi, q_ok = _samples(q_len, dense)
    fk, sk, ki, k_ok = _samples(kv_len, dense)
    zero = torch.zeros(1, 1, 1, 1, dtype=torch.long)
    cells_k = ki.numel() // sk
    rows_per_step = max(1, _BAND // (ki.numel() * sq))  # query cells per predicate call
    parts = []
    for start in range(0, qi.numel() // sq, rows_per_step):
        band = slice(start * sq, (start + rows_per_step) * sq)
        q = qi[band].view(1, 1, -1, 1)
        allowed = torch.broadcast_to(mask.allows(zero, zero, q, ki.view(1, 1, 1, -1), q_len, kv_len),
                                     (1, 1, q.shape[2], ki.numel()))[0, 0]
        valid = q_ok[band][:, None] & k_ok[None, :]
        shape = (-1, sq, cells_k, sk)  # (query cells, samples, key cells, samples)
        hits = (allowed & valid).reshape(shape).sum((1, 3))
        parts.append(hits.double() / valid.reshape(shape).sum((1, 3)))
    return torch.cat(parts), fq, fk


def block_states(mask: Mask, q_len: int, kv_len: int, block_size: int) -> tuple[torch.Tensor, float]:
    """(state per block: 0 skipped, 1 partial, 2 full; density) for sample 0, head 0."""
    layout = mask.block_layout(q_len, kv_len, block_size)
    active, full = layout.active[0, 0], layout.full[0, 0]
    return active.long() + (active & full).long(), layout.density


def element_fraction(view: torch.Tensor, fq: int, fk: int, q_len: int, kv_len: int) -> float:
    """Fraction of allowed entries from an element view, weighting each cell by the entries it covers."""
    rows = torch.full((view.shape[0],), float(fq), dtype=torch.float64)
    rows[-1] = q_len - fq * (view.shape[0] - 1)
    cols = torch.full((view.shape[1],), float(fk), dtype=torch.float64)
    cols[-1] = kv_len - fk * (view.shape[1] - 1)
    return (rows @ view @ cols).item() / (q_len * kv_len)
