"""Quantized keys and values: float8 (e4m3, e5m2), int8 and int4 codes with symmetric scales.

A :class:`KVFormat` says how a KV cache stores K and V (as vLLM's ``kv_cache_dtype`` does, and
FlashAttention-3's ``k_descale``/``v_descale``; Micikevicius et al. 2022, arXiv:2209.05433, for
the two float8 formats). Quantization is symmetric, one scale per tensor or per (token, head)::

    scale = amax / qmax                 (amax over the tensor, or over a row's D features; 1 where amax = 0)
    code  = clamp(round(x / scale), -qmax, qmax)      (float8: the cast rounds to nearest)
    x_hat = code * scale                (dequantized in float32, or float64 for float64 queries)

with ``qmax`` 448 (e4m3), 57344 (e5m2), 127 (int8) and 7 (int4). int4 codes are packed two per
byte (``uint8``, feature ``2i`` in the low nibble, ``2i + 1`` in the high one, two's complement),
so a row of ``D`` features takes ``D / 2`` bytes. Scales are float32.

Shapes: ``x (..., D)`` -> codes ``(..., D)`` (int4: ``(..., D / 2)`` uint8) and a scale ``()``
(per tensor) or ``x.shape[:-1]`` (per token and head).

:func:`attnkit.attention` takes such codes with ``k_scale=``/``v_scale=`` and dequantizes them
one key block at a time (:func:`dequantize` on each block; never the whole cache at once).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..errors import ArgumentError, DeviceError, DTypeError, ShapeError

__all__ = ["KVFormat", "Quantized", "KINDS", "CODE_DTYPES", "GRANULARITIES", "as_format", "dequantize",
           "format_of_codes", "check_scale"]

# kind -> (storage dtype, qmax, features per stored element)
_KINDS = {
    "float8_e4m3": (torch.float8_e4m3fn, 448.0, 1),
    "float8_e5m2": (torch.float8_e5m2, 57344.0, 1),
    "int8": (torch.int8, 127.0, 1),
    "int4": (torch.uint8, 7.0, 2),
}
KINDS = tuple(_KINDS)
GRANULARITIES = ("token_head", "tensor")
_BY_STORAGE = {dtype: kind for kind, (dtype, _, _) in _KINDS.items()}
CODE_DTYPES = frozenset(_BY_STORAGE)  # the dtypes of codes (uint8: packed int4)


@dataclass(frozen=True)
class KVFormat:
    """How keys and values are stored: ``kind`` (one of :data:`KINDS`) and whose scale (``granularity``).

    ``granularity="token_head"``: one scale per position and key/value head (the row's amax);
    ``"tensor"``: one scale for the whole tensor (a cache fixes it at its first append, the
    prefill, and clamps later rows to it, as a static calibrated scale does).

    Example:
        >>> import torch
        >>> fmt = KVFormat("int8")
        >>> codes, scale = fmt.quantize(torch.tensor([[1.0, -2.0, 0.5]]))
        >>> codes.tolist(), scale.tolist()
        ([[64, -127, 32]], [0.015748031437397003])
        >>> KVFormat("int4").bytes_per_token(kv_heads=8, head_dim=128)  # 2 * 8 * 64 code bytes + 2 * 8 * 4
        1088
    """

    kind: str = "float8_e4m3"
    granularity: str = "token_head"

    def __post_init__(self):
        if self.kind not in _KINDS:
            raise ArgumentError(f"KVFormat: kind must be one of {KINDS}; got {self.kind!r}")
        if self.granularity not in GRANULARITIES:
            raise ArgumentError(f"KVFormat: granularity must be one of {GRANULARITIES}; got {self.granularity!r}")

    def __str__(self) -> str:
        return f"{self.kind} ({'per (token, head)' if self.granularity == 'token_head' else 'per tensor'} scales)"

    @property
    def storage_dtype(self) -> torch.dtype:
        """The dtype of the stored codes (``uint8`` for packed int4)."""
        return _KINDS[self.kind][0]

    @property
    def qmax(self) -> float:
        """The largest code magnitude: ``scale = amax / qmax``."""
        return _KINDS[self.kind][1]

    @property
    def per_element(self) -> int:
        """Features per stored element (2 for packed int4, else 1)."""
        return _KINDS[self.kind][2]

    def stored_dim(self, dim: int, who: str = "KVFormat", name: str = "head_dim") -> int:
        """Stored elements of a row of ``dim`` features (int4: ``dim / 2``; ``dim`` must then be even)."""
        if dim % self.per_element:
            raise ShapeError(f"{who}: int4 packs two features per byte: {name} must be even; got {dim}")
        return dim // self.per_element

    def features(self, stored: int) -> int:
        """Features of a stored row of ``stored`` elements."""
        return stored * self.per_element

    def bytes_per_token(self, kv_heads: int, head_dim: int, v_head_dim: int | None = None) -> int:
        """Bytes one position takes in a cache: the K and V codes, plus two float32 scales per head
        (per-(token, head) scales; a per-tensor scale is not counted per token)."""
        dv = head_dim if v_head_dim is None else v_head_dim
        codes = kv_heads * (self.stored_dim(head_dim) + (self.stored_dim(dv, name="v_head_dim") if dv else 0))
        itemsize = torch.empty((), dtype=self.storage_dtype).element_size()
        scales = (2 if dv else 1) * kv_heads * 4 if self.granularity == "token_head" else 0
        return codes * itemsize + scales

    def scale_of(self, x: torch.Tensor) -> torch.Tensor:
        """``amax / qmax`` (1 where amax is 0), float32: ``()`` per tensor, ``x.shape[:-1]`` per token and head."""
        a = x.detach().abs().to(torch.float32)
        amax = a.amax() if self.granularity == "tensor" else a.amax(-1)
        return torch.where(amax > 0, amax / self.qmax, torch.ones_like(amax))

    def quantize(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(codes, scale)`` of ``x (..., D)``; ``scale`` (default :meth:`scale_of`) may be given (a fixed one)."""
        scale = self.scale_of(x) if scale is None else scale
        s = scale if scale.dim() == 0 else scale[..., None]
        y = (x.detach().to(torch.float32) / s).clamp(-self.qmax, self.qmax)
        if self.kind.startswith("float8"):
            return y.to(self.storage_dtype), scale
        n = torch.round(y)
        if self.kind == "int8":
            return n.to(torch.int8), scale
        n = n.to(torch.int16).reshape(*n.shape[:-1], self.stored_dim(n.shape[-1], name="x's last dim"), 2) & 15
        return (n[..., 0] | (n[..., 1] << 4)).to(torch.uint8), scale


def format_of_codes(dtype: torch.dtype) -> str | None:
    """The kind whose codes have ``dtype`` (``uint8``: packed int4), or None for another dtype."""
    return _BY_STORAGE.get(dtype)


def dequantize(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``code * scale`` in ``dtype``: codes ``(..., E)`` of a kind's storage dtype (uint8: packed int4, ``2 E``
    features), ``scale`` ``()`` or ``codes.shape[:-1]``."""
    if codes.dtype == torch.uint8:
        n = torch.stack((codes & 15, codes >> 4), -1).flatten(-2).to(torch.int16)
        codes = n - 16 * (n >= 8).to(torch.int16)
    s = scale.to(dtype)
    return codes.to(dtype) * (s if s.dim() == 0 else s[..., None])


def as_format(who: str, value) -> KVFormat | None:
    """``kv_format=`` of a cache: None (full precision), a :class:`KVFormat` or a kind's name (per (token, head))."""
    if value is None or isinstance(value, KVFormat):
        return value
    if isinstance(value, str):
        if value not in _KINDS:
            raise ArgumentError(f"{who}: kv_format must be a KVFormat or one of {KINDS}; got {value!r}")
        return KVFormat(value)
    raise DTypeError(f"{who}: kv_format must be a KVFormat, a kind's name or None; got {type(value).__name__}")


def check_scale(who: str, name: str, scale, codes: torch.Tensor, rows: tuple[int, ...]) -> torch.Tensor:
    """A scale for ``codes``: a float32 tensor on their device, ``()`` (per tensor) or ``rows`` (per token, head)."""
    if not isinstance(scale, torch.Tensor):
        raise DTypeError(f"{who}: {name} must be a float32 tensor; got {type(scale).__name__}")
    if scale.dtype != torch.float32:
        raise DTypeError(f"{who}: {name} must be a float32 tensor; got dtype {scale.dtype}")
    if scale.device != codes.device:
        raise DeviceError(f"{who}: {name} is on {scale.device} but the codes are on {codes.device}")
    if scale.dim() != 0 and tuple(scale.shape) != tuple(rows):
        raise ShapeError(f"{who}: {name} must have shape () (per tensor) or {tuple(rows)} (per token and head); "
                         f"got {tuple(scale.shape)}")
    return scale


class Quantized(NamedTuple):
    """The codes of a validated call's keys and values: their kind and scales aligned with the keys' 4-D layout.

    ``k_scale``/``v_scale``: ``()`` (per tensor) or ``(B, H_kv, Lk)`` (per position and head, possibly an
    expanded view, as the pool of a paged cache is)."""

    kind: str
    k_scale: torch.Tensor
    v_scale: torch.Tensor

    @property
    def format(self) -> KVFormat:
        return KVFormat(self.kind, "tensor" if self.k_scale.dim() == 0 else "token_head")

    def block(self, which: str, codes: torch.Tensor, start: int, stop: int, dtype: torch.dtype) -> torch.Tensor:
        """Positions ``[start, stop)`` (dim 2) of the keys (``which="k"``) or values, dequantized: one block only."""
        scale = self.k_scale if which == "k" else self.v_scale
        return dequantize(codes[:, :, start:stop], scale if scale.dim() == 0 else scale[:, :, start:stop], dtype)
