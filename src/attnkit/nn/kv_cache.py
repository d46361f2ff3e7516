"""A key/value cache for incremental (token-by-token) decoding with self-attention, and the mask it needs."""

from __future__ import annotations

import functools

import torch

from .. import masks
from ..errors import ArgumentError, DTypeError, ShapeError, check_int
from ..functional.quantize import KVFormat, as_format
from ._inputs import check_keep_mask, check_placement, check_sequence, check_shape
from .padding import clear_padding

__all__ = ["KVCache", "LatentCache", "CAUSAL", "decoding_mask", "check_step"]


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

    With ``kv_format`` (:class:`~attnkit.functional.quantize.KVFormat`: float8 e4m3/e5m2, int8, int4)
    the cache stores codes and scales instead (``scale = amax / qmax``, per (token, head) or per
    tensor, the latter fixed by the first append): :meth:`append` quantizes the new positions and
    returns the stored codes, which ``attnkit.attention(q, k, v, k_scale=, v_scale=)`` reads with
    :attr:`scales` (``**cache.scales``), dequantizing one key block at a time. A position then takes
    :attr:`bytes_per_token` bytes (float8: half of bfloat16 plus two float32 scales per head).
    Quantized caches do not carry gradients into the stored keys and values.

    Shapes:
        append(k ``(B, Hkv, t, D)``, v ``(B, Hkv, t, Dv)``) -> the stored keys
        ``(B, Hkv, n, D)`` and values ``(B, Hkv, n, Dv)``, ``n = len(cache)`` (quantized: their codes,
        ``(B, Hkv, n, D / 2)`` for int4, and ``scales`` ``(B, Hkv, n)`` or ``()``).

    Args:
        batch: batch size B.
        capacity: most positions the cache can hold; appending past it raises ShapeError.
        kv_heads: key/value heads Hkv.
        head_dim: key feature size D.
        v_head_dim: value feature size Dv (default ``head_dim``; 0: a cache of keys alone, whose
            values the caller reads from the keys, as a latent cache does).
        dtype, device: of the buffers (default float32, CPU); quantized: of the appended keys and values.
        kv_format: None (full precision), a :class:`~attnkit.functional.quantize.KVFormat` or a kind's name
            (``"float8_e4m3"``, ``"float8_e5m2"``, ``"int8"``, ``"int4"``: per (token, head) scales).

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
                 dtype: torch.dtype | None = None, device=None, kv_format: KVFormat | str | None = None):
        dims = (_check_size("batch", batch, 0), _check_size("kv_heads", kv_heads, 1))
        self.capacity = _check_size("capacity", capacity, 0)
        d = _check_size("head_dim", head_dim, 1)
        dv = d if v_head_dim is None else _check_size("v_head_dim", v_head_dim, 0)
        self.kv_format = fmt = as_format("KVCache", kv_format)
        self._dims = (d, dv)
        self._dtype = dtype or torch.get_default_dtype()
        stored = (d, dv) if fmt is None else (fmt.stored_dim(d, "KVCache"), fmt.stored_dim(dv, "KVCache", "v_head_dim"))
        code = self._dtype if fmt is None else fmt.storage_dtype
        self._k = torch.zeros(*dims, self.capacity, stored[0], dtype=code, device=device)
        self._v = torch.zeros(*dims, self.capacity, stored[1], dtype=code, device=device)
        self._scales = None if fmt is None else self._empty_scales()
        self._length = 0

    def _empty_scales(self) -> list[torch.Tensor | None]:
        """Per (token, head): zero buffers ``(B, Hkv, capacity)``; per tensor: set by the first append."""
        assert self.kv_format is not None  # scales are kept for a quantized cache alone
        if self.kv_format.granularity == "tensor":
            return [None, None]
        return [self._k.new_zeros(self._k.shape[:3], dtype=torch.float32) for _ in range(2)]

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        b, h, _, _ = self._k.shape
        fmt = "" if self.kv_format is None else f", kv_format={self.kv_format}"
        return (f"KVCache(batch={b}, kv_heads={h}, head_dim={self._dims[0]}, length={self._length}, "
                f"capacity={self.capacity}{fmt})")

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(batch, kv_heads, capacity, head_dim)`` of the keys (``head_dim`` in features, also when packed)."""
        return (*self._k.shape[:3], self._dims[0])

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the keys and values appended and returned (quantized: appended; the codes: ``keys.dtype``)."""
        return self._dtype

    @property
    def scales(self) -> dict[str, torch.Tensor]:
        """``{"k_scale": ..., "v_scale": ...}`` of the stored positions for ``attnkit.attention(..., **scales)``:
        ``(B, Hkv, n)`` or ``()`` float32; empty for a full-precision cache."""
        if self._scales is None:
            return {}
        n = self._length
        k, v = (torch.ones((), device=self.device) if s is None else s if s.dim() == 0 else s[:, :, :n]
                for s in self._scales)
        return {"k_scale": k, "v_scale": v}

    @property
    def bytes_per_token(self) -> int:
        """Bytes one position takes: keys and values in the cache's dtype, or the format's codes and scales."""
        heads, (d, dv) = self._k.shape[1], self._dims
        if self.kv_format is not None:
            return self.kv_format.bytes_per_token(heads, d, dv)
        return heads * (d + dv) * self._k.element_size()

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
        self._scales = None if self.kv_format is None else self._empty_scales()
        self._length = 0

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` stored positions and forget the rest (rejected draft tokens); the
        forgotten positions are zeroed, so the cache equals one that never held them."""
        length = check_int("KVCache.truncate", "length", length, 0)
        if length > self._length:
            raise ArgumentError(f"KVCache.truncate: length must be at most the {self._length} stored positions; "
                                f"got {length}")
        tail = slice(length, self._length)
        grad = torch.is_grad_enabled() and (self._k.requires_grad or self._v.requires_grad)
        for name in ("_k", "_v"):
            t = getattr(self, name)
            if grad:  # out of place: earlier steps' graphs keep the buffers they saw
                setattr(self, name, torch.cat([t[:, :, :length], torch.zeros_like(t[:, :, length:])], 2))
            else:
                t[:, :, tail] = torch.zeros_like(t[:, :, tail])
        if self._scales is not None:
            for s in self._scales:
                if s is not None and s.dim():
                    s[:, :, tail] = 0
        self._length = length

    def commit(self, tree, nodes) -> None:
        """Keep the accepted nodes of a draft tree verified in one call and drop the others.

        ``tree``: the :func:`attnkit.masks.tree` whose ``T`` nodes are the last ``T`` stored positions;
        ``nodes``: a root-to-node path of it (one list for every batch row, or one per row, all as long),
        in order. The path's keys and values move right after the committed positions and the rest is
        truncated: the cache then equals one that decoded the path alone.
        """
        from ..masks.tree import TreeMask

        who = "KVCache.commit"
        if not isinstance(tree, TreeMask):
            raise DTypeError(f"{who}: tree must be an attnkit.masks.tree(parents); got {type(tree).__name__}")
        start = self._length - tree.nodes
        if start < 0:
            raise ShapeError(f"{who}: the tree's {tree.nodes} nodes must be the last stored positions; the cache "
                             f"holds {self._length}")
        batch = self._k.shape[0]
        rows = [list(nodes)] * batch if not nodes or not isinstance(nodes[0], (list, tuple)) else list(nodes)
        if len(rows) != batch or len({len(r) for r in rows}) > 1:
            raise ShapeError(f"{who}: nodes must be one path, or one per batch row ({batch}) all as long; got "
                             f"{[len(r) for r in rows]} paths' lengths")
        paths = [tree.check_path(who, r, b if tree.batch_size else 0) for b, r in enumerate(rows)]
        m = len(paths[0])
        buffers = [self._k, self._v] + [s for s in (self._scales or ()) if s is not None and s.dim()]
        for b, path in enumerate(paths if m else ()):
            idx = torch.tensor(path, device=self._k.device) + start
            for t in buffers:  # (B, Hkv, capacity, .) or scales (B, Hkv, capacity)
                t[b, :, start:start + m] = t[b].index_select(1, idx)
        self.truncate(start + m)

    def _check(self, name: str, t, buffer: torch.Tensor) -> None:
        b, h, _, _ = buffer.shape
        d = self._dims[0 if name == "k" else 1]
        # attribute comparisons only on the common call (once per layer and token); the named errors below
        if (type(t) is torch.Tensor and t.dtype == self._dtype and t.device == buffer.device and t.dim() == 4
                and t.shape[0] == b and t.shape[1] == h and t.shape[3] == d):
            return
        who = "KVCache.append"
        check_placement(who, name, t, dtype=self._dtype, device=buffer.device, owner="the cache")
        check_shape(who, name, t, lambda t: t.dim() == 4 and (t.shape[0], t.shape[1], t.shape[3]) == (b, h, d),
                    f"have shape (batch={b}, kv_heads={h}, new_len, {d})")

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``t`` new positions after the current ones; return all stored keys and values."""
        kb = self._k
        # the common call (once per layer and token) passes on a few attribute reads and tuple comparisons (each
        # read of a tensor's shape or device builds an object: read once); _check names the error of any other
        ks = k.shape if type(k) is torch.Tensor else ()
        vs = v.shape if type(v) is torch.Tensor else ()
        bs = kb.shape
        if not (len(ks) == 4 and len(vs) == 4 and ks[0] == vs[0] == bs[0] and ks[1] == vs[1] == bs[1]
                and (ks[3], vs[3]) == self._dims and k.dtype == self._dtype and v.dtype == self._dtype
                and k.device == kb.device and v.device == kb.device):
            self._check("k", k, kb)
            self._check("v", v, self._v)
            ks, vs = k.shape, v.shape  # (tensor subclasses pass _check too)
        if ks[2] != vs[2]:
            raise ShapeError(f"KVCache.append: k and v must add the same number of positions; got "
                             f"k {tuple(k.shape)} and v {tuple(v.shape)}")
        start = self._length
        stop = start + ks[2]
        if stop > self.capacity:
            raise ShapeError(f"KVCache.append: capacity {self.capacity} exceeded: {start} positions stored + "
                             f"{ks[2]} new = requested length {stop}; make the cache with capacity >= {stop}")
        if self.kv_format is not None:
            return self._append_codes(k, v, start, stop)
        if torch.is_grad_enabled() and any(t.requires_grad for t in (k, v, self._k, self._v)):
            # Out of place: earlier steps' graphs keep the buffers they saw.
            self._k = torch.cat([self._k[:, :, :start], k, self._k[:, :, stop:]], dim=2)
            self._v = torch.cat([self._v[:, :, :start], v, self._v[:, :, stop:]], dim=2)
        else:
            kb[:, :, start:stop] = k
            self._v[:, :, start:stop] = v
        self._length = stop
        return self._k[:, :, :stop], self._v[:, :, :stop]  # views of the buffers, as keys and values

    def _append_codes(self, k, v, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantize and store the new positions (a per-tensor scale is fixed by the first append)."""
        assert self.kv_format is not None and self._scales is not None  # a quantized cache
        for i, (t, buffer) in enumerate(((k, self._k), (v, self._v))):
            if t.shape[3] == 0:
                continue
            scale = self._scales[i]
            fixed = scale if scale is not None and scale.dim() == 0 else None
            codes, new_scale = self.kv_format.quantize(t, fixed)
            buffer[:, :, start:stop] = codes
            if new_scale.dim():
                assert scale is not None  # per (token, head): the buffer of _empty_scales
                scale[:, :, start:stop] = new_scale
            else:
                self._scales[i] = new_scale
        self._length = stop
        return self._k[:, :, :stop], self._v[:, :, :stop]  # the stored codes; their scales: self.scales


class LatentCache(KVCache):
    """The decoding cache of :class:`MultiHeadLatentAttention`: ``[c^KV; k^R]`` per token, nothing per head.

    A :class:`KVCache` of one key "head" of ``kv_lora_rank + qk_rope_head_dim`` features and no
    values: the absorbed form of :class:`~attnkit.nn.MultiHeadLatentAttention` attends over the stored
    rows as they are (keys ``[c; k^R]``, values their first ``kv_lora_rank`` features), the naive
    form decompresses them.

    Args:
        batch, capacity: as :class:`KVCache`.
        kv_lora_rank: ``d_c``, the latent's size.
        rope_dim: ``d_h^R``, the shared rotated key's size.
        dtype, device: of the buffer.
        kv_format: quantized rows (:class:`~attnkit.functional.quantize.KVFormat`): one scale per row (or per
            tensor) for ``[c; k^R]``, so the values (the first ``d_c`` features) share the keys' scales
            (:attr:`scales`); int4 needs an even ``kv_lora_rank``.
    """

    def __init__(self, batch: int, capacity: int, kv_lora_rank: int, rope_dim: int, *, dtype=None, device=None,
                 kv_format=None):
        super().__init__(batch, capacity, 1, kv_lora_rank + rope_dim, v_head_dim=0, dtype=dtype, device=device,
                         kv_format=kv_format)
        self.kv_lora_rank = kv_lora_rank
        self._split = kv_lora_rank if self.kv_format is None else self.kv_format.stored_dim(
            kv_lora_rank, "LatentCache", "kv_lora_rank")  # where c^KV ends in a stored row

    @property
    def scales(self) -> dict[str, torch.Tensor]:
        """A quantized cache's row scales, as ``k_scale`` and ``v_scale`` both (the values are the rows' first
        ``d_c`` features); empty for a full-precision cache."""
        scales = super().scales
        return {"k_scale": scales["k_scale"], "v_scale": scales["k_scale"]} if scales else scales

    def append_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Store ``rows (B, 1, t, d_c + d_h^R)`` after the cached ones; return every stored row ``(B, 1, n, .)``."""
        return self.append(rows, rows[..., :0])[0]

    @property
    def latent(self) -> torch.Tensor:
        """The stored ``c^KV`` ``(B, 1, n, d_c)`` (a view; quantized: its codes)."""
        return self.keys[..., :self._split]

    @property
    def rope_keys(self) -> torch.Tensor:
        """The stored rotated keys ``k^R`` ``(B, 1, n, d_h^R)`` (a view; quantized: their codes)."""
        return self.keys[..., self._split:]



# Masks are immutable: one bottom-right causal mask serves every decoding step of every module.
CAUSAL = masks.causal()


def decoding_mask(causal: bool, pattern, t: int, n: int, keep: torch.Tensor | None):
    """The mask of ``t`` new queries against ``n`` keys (``n - t`` cached): ``causal & pattern & keys(keep)``.

    Causality is bottom-right aligned (query ``i`` sees keys ``j <= i + n - t``; :data:`CAUSAL`) and
    ``pattern``, a mask written for the whole ``n x n`` sequence, is read at the queries' absolute rows;
    None when nothing restricts the keys.
    """
    if pattern is None and keep is None:  # the common step builds nothing
        return CAUSAL if causal else None
    parts = [CAUSAL] if causal else []
    if pattern is not None:
        parts.append(pattern if t == n else masks.shifted(pattern, q0=n - t, q_len=n, kv_len=n))
    if keep is not None:
        parts.append(masks.keys(keep))
    return functools.reduce(lambda a, b: a & b, parts) if parts else None


def check_step(who: str, module, x, dim: int, key_keep_mask, cache, kind: type = KVCache):
    """A self-attention call's inputs: ``x (B, t, dim)``, ``cache`` a ``kind`` or None, ``key_keep_mask (B, n)``
    over the cached and new positions. Returns ``x`` with its padded rows cleared (the padding promise,
    :func:`~attnkit.nn.padding.clear_padding`) and the number of positions already cached."""
    if cache is not None and not isinstance(cache, kind):
        raise DTypeError(f"{who}: cache must be a {kind.__name__} (see new_cache); got {type(cache).__name__}")
    check_sequence(who, "x", x, dim, named=True, like=module)
    start = 0 if cache is None else len(cache)
    if key_keep_mask is None:
        return x, start
    check_keep_mask(who, "key_keep_mask", key_keep_mask, x.shape[0], start + x.shape[1])  # n = cached + new
    return clear_padding(x, key_keep_mask[:, start:]), start
