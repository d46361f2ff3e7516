"""Masks that hold data: positions, layouts, ids, lengths, dense tensors, functions.

Each is a :class:`~attnkit.masks.base.Mask`; the constructors users
call live in :mod:`attnkit.masks`.
"""

from __future__ import annotations

import torch

from ..errors import ArgumentError, DTypeError, check_int
from .base import Mask, _block_bounds, gather_at

_FAR = 1 << 62  # an index bound beyond any sequence


def _index_tensor(name, values, *, nonnegative: bool = False) -> torch.Tensor:
    # An empty Python sequence holds no positions (torch would make it float32): it is a valid empty index.
    empty_sequence = not isinstance(values, torch.Tensor) and hasattr(values, "__len__") and len(values) == 0
    t = torch.zeros(0, dtype=torch.long) if empty_sequence else torch.as_tensor(values)
    if t.dtype in (torch.bool,) or t.is_floating_point() or t.is_complex():
        raise DTypeError(f"{name} must hold integer positions; got dtype {t.dtype}")
    if nonnegative and t.numel() and int(t.min()) < 0:
        raise ArgumentError(f"{name} must be >= 0; got {t.tolist()}")
    return t.long()


class _GlobalTokens(Mask):
    uses = frozenset({"q", "kv"})

    def __init__(self, idx):
        self.idx = _index_tensor("idx (global token positions)", idx, nonnegative=True).flatten()

    def _is_global(self, pos, length):
        lut = torch.zeros(length + 1, dtype=torch.bool, device=pos.device)
        idx = self.idx.to(pos.device)
        lut[idx[idx < length]] = True
        return lut[pos.clamp(0, length)]  # positions >= length map to the False sentinel

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        return self._is_global(q_idx, q_len) | self._is_global(kv_idx, kv_len)

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        def per_block(length):
            n = -(-length // bs)
            flags = torch.zeros(n * bs, dtype=torch.bool, device=device)
            flags[:length] = self._is_global(torch.arange(length, device=device), length)
            in_range = torch.arange(n * bs, device=device) < length
            return (flags.view(n, bs).any(1), (flags | ~in_range).view(n, bs).all(1))
        q_any, q_all = per_block(q_len)
        k_any, k_all = per_block(kv_len)
        active = q_any[:, None] | k_any[None, :]
        full = q_all[:, None] | k_all[None, :]
        return active[None, None], full[None, None]

    def __repr__(self):
        return f"global_tokens({self.idx.tolist()})"


class _BlockLayoutMask(Mask):
    def __init__(self, layout, block_size):
        layout = torch.as_tensor(layout)
        if layout.dtype != torch.bool:
            raise DTypeError(f"layout must be a bool tensor; got dtype {layout.dtype}")
        if not 2 <= layout.dim() <= 4:
            raise ArgumentError("layout must have shape (nq, nk), (H, nq, nk) or (B, H, nq, nk); "
                             f"got {tuple(layout.shape)}")
        self.layout = layout.reshape((1,) * (4 - layout.dim()) + tuple(layout.shape))
        self.block = check_int(None, "block_size", block_size, 1)
        self.uses = frozenset({"q", "kv"}) | ({"b"} if self.layout.shape[0] > 1 else set()) | (
            {"h"} if self.layout.shape[1] > 1 else set())
        self.batch_size = self.layout.shape[0] if "b" in self.uses else None
        self.num_heads = self.layout.shape[1] if "h" in self.uses else None

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        lay = self.layout.to(q_idx.device)
        qb, kb = q_idx // self.block, kv_idx // self.block
        inside = (qb < lay.shape[2]) & (kb < lay.shape[3])
        b = b if "b" in self.uses else torch.zeros_like(b)
        h = h if "h" in self.uses else torch.zeros_like(h)
        return inside & lay[b, h, qb.clamp(max=lay.shape[2] - 1), kb.clamp(max=lay.shape[3] - 1)]

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        """Exact for any block size, from rectangle sums of the layout in ``O(nq nk)``."""
        nq, nk = -(-q_len // bs), -(-kv_len // bs)
        lay = self.layout.to(device)
        if bs == self.block and nq <= lay.shape[2] and nk <= lay.shape[3]:
            lay = lay[:, :, :nq, :nk]
            return lay, lay
        sums = torch.nn.functional.pad(lay.to(torch.int64).cumsum(2).cumsum(3), (1, 0, 1, 0))  # prefix sums

        def spans(length, extent):  # layout blocks each kernel block overlaps; whether it runs past the layout
            first, last = (t // self.block for t in _block_bounds(length, bs, device))
            return first.clamp(max=extent), last.clamp(max=extent - 1), last >= extent
        r0, r1, q_out = spans(q_len, lay.shape[2])
        c0, c1, k_out = spans(kv_len, lay.shape[3])
        at = lambda r, c: sums[:, :, r[:, None], c[None, :]]
        count = at(r1 + 1, c1 + 1) - at(r0, c1 + 1) - at(r1 + 1, c0) + at(r0, c0)
        area = (r1 - r0 + 1).clamp(min=0)[:, None] * (c1 - c0 + 1).clamp(min=0)[None, :]
        return count > 0, (count == area) & (count > 0) & ~q_out[:, None] & ~k_out[None, :]

    def __repr__(self):
        return f"block_layout(shape={tuple(self.layout.shape)}, block_size={self.block})"


def _per_batch(name, t, dim_name):
    """Normalise a per-position tensor to (B|1, L) and report its batch size."""
    if t.dim() == 1:
        return t[None], None
    if t.dim() == 2:
        return t, t.shape[0]
    raise ArgumentError(f"{name} must have shape ({dim_name},) or (batch, {dim_name}); got {tuple(t.shape)}")


def _rows(t, b):
    """Index a (B|1, L) tensor's batch dimension with b (broadcast if B is 1)."""
    return b if t.shape[0] > 1 else torch.zeros_like(b)


class _Segments(Mask):
    def __init__(self, q_ids, kv_ids):
        q_ids = _index_tensor("q_ids", q_ids)
        kv_ids = q_ids if kv_ids is None else _index_tensor("kv_ids", kv_ids)
        self.q_ids, qb = _per_batch("q_ids", q_ids, "q_len")
        self.kv_ids, kb = _per_batch("kv_ids", kv_ids, "kv_len")
        if qb and kb and qb != kb:
            raise ArgumentError(f"q_ids and kv_ids must share a batch size; got {qb} and {kb}")
        self.batch_size = qb or kb
        self.q_len, self.kv_len = self.q_ids.shape[1], self.kv_ids.shape[1]
        self.uses = frozenset({"q", "kv"} | ({"b"} if self.batch_size else set()))

    def _ids(self, ids, b, idx, length):
        if ids.shape[1] < length:
            raise ArgumentError(f"segment ids cover {ids.shape[1]} positions but the sequence has {length}")
        ids = ids.to(idx.device)
        return ids[_rows(ids, b), idx.clamp(max=ids.shape[1] - 1)]

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        return self._ids(self.q_ids, b, q_idx, q_len) == self._ids(self.kv_ids, b, kv_idx, kv_len)

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        def ranges(ids, length):  # per block min/max id: overlap test is a safe over-approximation
            ids = ids[:, :length].to(device)
            n = -(-length // bs)
            pad = n * bs - length
            lo = torch.nn.functional.pad(ids, (0, pad), value=_FAR).view(ids.shape[0], n, bs).amin(2)
            hi = torch.nn.functional.pad(ids, (0, pad), value=-_FAR).view(ids.shape[0], n, bs).amax(2)
            return lo, hi
        q_lo, q_hi = ranges(self.q_ids, q_len)
        k_lo, k_hi = ranges(self.kv_ids, kv_len)
        active = (q_lo[:, :, None] <= k_hi[:, None, :]) & (k_lo[:, None, :] <= q_hi[:, :, None])
        full = (q_lo[:, :, None] == q_hi[:, :, None]) & (k_lo[:, None, :] == k_hi[:, None, :]) & (
            q_lo[:, :, None] == k_lo[:, None, :])
        return active[:, None], full[:, None]

    def __repr__(self):
        return f"segments(q_ids={tuple(self.q_ids.shape)}, kv_ids={tuple(self.kv_ids.shape)})"


class _Padding(Mask):
    """Per batch element b, keys ``j < lengths[b]``."""

    uses = frozenset({"b", "kv"})
    kind = "keys"

    def __init__(self, lengths):
        self.lengths = _index_tensor("lengths", lengths, nonnegative=True).flatten()
        self.batch_size = self.lengths.numel()

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        return kv_idx < self.lengths.to(kv_idx.device)[b]

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        k_first, k_last = _block_bounds(kv_len, bs, device)
        n = self.lengths.to(device).view(-1, 1, 1, 1)
        nq = -(-q_len // bs)
        active = (k_first.view(1, 1, 1, -1) < n).expand(-1, 1, nq, -1)
        full = (k_last.view(1, 1, 1, -1) < n).expand(-1, 1, nq, -1)
        return active, full

    def __repr__(self):
        return f"padding(lengths={self.lengths.tolist()})"


class TensorMask(Mask):
    """A dense bool tensor ``(B|1, H|1, Lq|1, Lk)`` seen as a mask (validated by the caller)."""

    kind = "tensor"

    def __init__(self, tensor: torch.Tensor):
        if tensor.dtype != torch.bool or tensor.dim() != 4:
            raise DTypeError(f"TensorMask needs a 4-D bool tensor; got {tensor.dim()}-D {tensor.dtype}")
        self.tensor = tensor
        names = ("b", "h", "q", "kv")
        # A size-1 dim broadcasts; any other size, 0 included (an empty batch), is the mask's own.
        self.uses = frozenset(n for n, s in zip(names, tensor.shape, strict=True) if s != 1 or n == "kv")
        self.batch_size = tensor.shape[0] if tensor.shape[0] != 1 else None
        self.num_heads = tensor.shape[1] if tensor.shape[1] != 1 else None
        self.q_len = tensor.shape[2] if tensor.shape[2] != 1 else None
        self.kv_len = tensor.shape[3]

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        return gather_at(self.tensor, b, h, q_idx, kv_idx)

    def materialize(self, q_len, kv_len, *, batch=None, heads=None, device=None):
        t = self.tensor.to(device) if device is not None else self.tensor
        return torch.broadcast_to(t, (t.shape[0], t.shape[1], q_len, kv_len))

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        """Pool the tensor into blocks (padding lanes: never active, never break fullness)."""
        t = self.materialize(q_len, kv_len, device=device)
        nq, nk = -(-q_len // bs), -(-kv_len // bs)
        pad = (0, nk * bs - kv_len, 0, nq * bs - q_len)
        blocks = (t.shape[0], t.shape[1], nq, bs, nk, bs)
        active = torch.nn.functional.pad(t, pad, value=False).reshape(blocks).any(5).any(3)
        full = torch.nn.functional.pad(t, pad, value=True).reshape(blocks).all(5).all(3)
        return active, full

    def __repr__(self):
        return f"TensorMask(shape={tuple(self.tensor.shape)})"


class _FromFunction(Mask):
    def __init__(self, fn, name):
        if not callable(fn):
            raise DTypeError(f"from_function needs a callable (b, h, q_idx, kv_idx) -> bool; got {type(fn).__name__}")
        self.fn, self.name = fn, name or getattr(fn, "__name__", "fn")

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        out = self.fn(b, h, q_idx, kv_idx)
        if not isinstance(out, torch.Tensor) or out.dtype != torch.bool:
            got = getattr(out, "dtype", type(out).__name__)
            raise DTypeError(f"mask function {self.name!r} must return a bool tensor; got {got}")
        return out

    def __repr__(self):
        return f"from_function({self.name})"
