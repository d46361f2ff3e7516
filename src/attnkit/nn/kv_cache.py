"""A key/value cache for incremental (token-by-token) decoding with self-attention."""

from __future__ import annotations

import torch

from ..errors import ShapeError, check_int
from ._inputs import check_placement, check_shape

__all__ = ["KVCache"]


def _check_size(name: str, value, minimum: int) -> int:
    return check_int("KVCache", name, value, minimum)


class KVCache:
    """Preallocated keys and values of the positions decoded so far, per key/value head.

    Holds ``keys``/``values`` of shape ``(batch, kv_heads, length, head_dim)`` in buffers
    of ``capacity`` positions. :meth:`append` writes new positions after the stored
    ones exactly (no cast: the dtype must match) and returns every stored position;
    attending to them with a bottom-right causal mask (:func:`attnkit.masks.causal`)
    makes prefill + step-by-step decoding equal one full causal pass.

    The buffers are written in place when autograd is not recording (the usual
    inference case, O(new positions) per step); when the appended tensors require
    grad they are combined out of place (O(capacity) per step), so gradients through
    several steps are exact.

    Shapes:
        append(k ``(B, Hkv, t, D)``, v ``(B, Hkv, t, Dv)``) -> the stored keys
        ``(B, Hkv, n, D)`` and values ``(B, Hkv, n, Dv)``, ``n = len(cache)``.

    Args:
        batch: batch size B.
        capacity: most positions the cache can hold; appending past it raises ShapeError.
        kv_heads: key/value heads Hkv.
        head_dim: key feature size D.
        v_head_dim: value feature size Dv (default ``head_dim``).
        dtype, device: of the buffers (default float32, CPU).

    Example:
        >>> import torch
        >>> from attnkit.nn.kv_cache import KVCache
        >>> cache = KVCache(2, 4, 3, 5)
        >>> k, v = cache.append(torch.ones(2, 3, 3, 5), torch.ones(2, 3, 3, 5))
        >>> len(cache), tuple(k.shape)
        (3, (2, 3, 3, 5))
        >>> cache.reset(); len(cache)
        0
    """

    def __init__(self, batch: int, capacity: int, kv_heads: int, head_dim: int, *, v_head_dim: int | None = None,
                 dtype: torch.dtype | None = None, device=None):
        dims = (_check_size("batch", batch, 0), _check_size("kv_heads", kv_heads, 1))
        self.capacity = _check_size("capacity", capacity, 0)
        d = _check_size("head_dim", head_dim, 1)
        dv = d if v_head_dim is None else _check_size("v_head_dim", v_head_dim, 1)
        self._k = torch.zeros(*dims, self.capacity, d, dtype=dtype, device=device)
        self._v = torch.zeros(*dims, self.capacity, dv, dtype=dtype, device=device)
        self._length = 0

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        b, h, _, d = self._k.shape
        return f"KVCache(batch={b}, kv_heads={h}, head_dim={d}, length={self._length}, capacity={self.capacity})"

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(batch, kv_heads, capacity, head_dim)`` of the key buffer."""
        return tuple(self._k.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self._k.dtype

    @property
    def device(self) -> torch.device:
        return self._k.device

    @property
    def keys(self) -> torch.Tensor:
        """The stored keys ``(B, Hkv, n, D)`` (a view of the buffer)."""
        return self._k[:, :, : self._length]

    @property
    def values(self) -> torch.Tensor:
        """The stored values ``(B, Hkv, n, Dv)`` (a view of the buffer)."""
        return self._v[:, :, : self._length]

    def reset(self) -> None:
        """Forget every stored position (fresh zero buffers; earlier results stay valid)."""
        self._k, self._v = torch.zeros_like(self._k), torch.zeros_like(self._v)
        self._length = 0

    def _check(self, name: str, t, buffer: torch.Tensor) -> None:
        who = "KVCache.append"
        check_placement(who, name, t, dtype=buffer.dtype, device=buffer.device, owner="the cache")
        b, h, _, d = buffer.shape
        check_shape(who, name, t, lambda t: t.dim() == 4 and (t.shape[0], t.shape[1], t.shape[3]) == (b, h, d),
                    f"have shape (batch={b}, kv_heads={h}, new_len, {d})")

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``t`` new positions after the current ones; return all stored keys and values."""
        self._check("k", k, self._k)
        self._check("v", v, self._v)
        if k.shape[2] != v.shape[2]:
            raise ShapeError(f"KVCache.append: k and v must add the same number of positions; got "
                             f"k {tuple(k.shape)} and v {tuple(v.shape)}")
        start, stop = self._length, self._length + k.shape[2]
        if stop > self.capacity:
            raise ShapeError(f"KVCache.append: capacity {self.capacity} exceeded: {start} positions stored + "
                             f"{k.shape[2]} new = requested length {stop}; make the cache with capacity >= {stop}")
        if torch.is_grad_enabled() and any(t.requires_grad for t in (k, v, self._k, self._v)):
            # Out of place: earlier steps' graphs keep the buffers they saw.
            self._k = torch.cat([self._k[:, :, :start], k, self._k[:, :, stop:]], dim=2)
            self._v = torch.cat([self._v[:, :, :start], v, self._v[:, :, stop:]], dim=2)
        else:
            self._k[:, :, start:stop] = k
            self._v[:, :, start:stop] = v
        self._length = stop
        return self.keys, self.values
