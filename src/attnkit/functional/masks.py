"""Mask constructors: each a function of indices, True = attend.

Causal alignment, for ``Lq`` queries against ``Lk`` keys (``off = Lk - Lq``)::

    bottom_right (default; decoding against a KV cache)   top_left
    Lq=2, Lk=4:  q0: x x x .                              q0: x . . .
                 q1: x x x x                              q1: x x . .
    query i sees keys j <= i + off                        query i sees keys j <= i

With ``Lq == Lk`` both are the usual lower triangle. Bottom-right with ``Lq > Lk``
leaves the first ``Lq - Lk`` rows with no key: their output is 0 (never NaN).

Examples:
    >>> from attnkit import masks
    >>> m = masks.causal() & masks.sliding_window(2, 0)
    >>> m
    (causal(align='bottom_right') & sliding_window(left=2, right=0, align='bottom_right'))
    >>> m.materialize(4, 4)[0, 0].int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1]]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .mask_base import Mask, Or, _block_bounds

__all__ = [
    "full", "causal", "sliding_window", "dilated", "strided", "fixed", "global_tokens",
    "block_layout", "segments", "padding", "keys", "prefix_lm", "from_function",
    "TensorMask",
]

_ALIGNMENTS = ("bottom_right", "top_left")
_FAR = 1 << 62  # an index bound beyond any sequence


def _check_align(align: str) -> str:
    if align not in _ALIGNMENTS:
        raise ValueError(f"align must be one of {_ALIGNMENTS}; got {align!r}")
    return align


def _offset(align: str, q_len: int, kv_len: int) -> int:
    return kv_len - q_len if align == "bottom_right" else 0


def _check_count(name: str, value, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}; got {value!r}")
    return value


class _Band(Mask):
    """Keys ``lo(i) <= j <= hi(i)`` with bounds that grow with ``i``: exact analytic layout."""

    uses = frozenset({"q", "kv"})

    def bounds(self, q_idx, q_len, kv_len):
        raise NotImplementedError

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        lo, hi = self.bounds(q_idx, q_len, kv_len)
        return (kv_idx >= lo) & (kv_idx <= hi)

    def _layout(self, q_len, kv_len, bs, device):
        q_first, q_last = _block_bounds(q_len, bs, device)
        k_first, k_last = _block_bounds(kv_len, bs, device)
        lo_first, hi_first = self.bounds(q_first, q_len, kv_len)
        lo_last, hi_last = self.bounds(q_last, q_len, kv_len)
        col = lambda t: t.view(-1, 1)
        active = (col(lo_first) <= k_last) & (col(hi_last) >= k_first) & (col(lo_first) <= col(hi_last))
        full = (col(lo_last) <= k_first) & (col(hi_first) >= k_last)
        return active[None, None], full[None, None]


class _Causal(_Band):
    def __init__(self, align):
        self.align = _check_align(align)

    def bounds(self, q_idx, q_len, kv_len):
        return torch.full_like(q_idx, -_FAR), q_idx + _offset(self.align, q_len, kv_len)

    def __repr__(self):
        return f"causal(align={self.align!r})"


class _SlidingWindow(_Band):
    def __init__(self, left, right, align):
        self.left, self.right = _check_count("left", left), _check_count("right", right)
        self.align = _check_align(align)

    def bounds(self, q_idx, q_len, kv_len):
        pos = q_idx + _offset(self.align, q_len, kv_len)
        return pos - self.left, pos + self.right

    def __repr__(self):
        return f"sliding_window(left={self.left}, right={self.right}, align={self.align!r})"


class _Dilated(_SlidingWindow):
    """Every ``dilation``-th key within ``window`` steps: a band with holes."""

    def __init__(self, window, dilation, align):
        self.window = _check_count("window", window)
        self.dilation = _check_count("dilation", dilation, 1)
        super().__init__(window * dilation, window * dilation, align)

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        pos = q_idx + _offset(self.align, q_len, kv_len)
        return super().allows(b, h, q_idx, kv_idx, q_len, kv_len) & ((pos - kv_idx) % self.dilation == 0)

    def _layout(self, q_len, kv_len, bs, device):
        active, full = super()._layout(q_len, kv_len, bs, device)
        return active, full if self.dilation == 1 else torch.zeros_like(full)

    def __repr__(self):
        return f"dilated(window={self.window}, dilation={self.dilation}, align={self.align!r})"


class _Strided(Mask):
    uses = frozenset({"q", "kv"})

    def __init__(self, stride):
        self.stride = _check_count("stride", stride, 1)

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        delta = q_idx - kv_idx
        return (delta.abs() < self.stride) | (delta % self.stride == 0)

    def __repr__(self):
        return f"strided({self.stride})"


class _Fixed(Mask):
    uses = frozenset({"q", "kv"})

    def __init__(self, block, summary):
        self.block = _check_count("block", block, 1)
        self.summary = _check_count("summary", summary, 1)
        if summary > block:
            raise ValueError(f"summary must be <= block; got summary={summary}, block={block}")

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        same_block = (q_idx // self.block) == (kv_idx // self.block)
        summary_key = (kv_idx % self.block) >= self.block - self.summary
        return same_block | summary_key

    def __repr__(self):
        return f"fixed(block={self.block}, summary={self.summary})"


class _Full(Mask):
    uses = frozenset()

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        return torch.ones((), dtype=torch.bool, device=q_idx.device)

    def _layout(self, q_len, kv_len, bs, device):
        shape = (1, 1, -(-q_len // bs), -(-kv_len // bs))
        ones = torch.ones(shape, dtype=torch.bool, device=device)
        return ones, ones

    def __repr__(self):
        return "full()"


def _index_tensor(name, values) -> torch.Tensor:
    t = torch.as_tensor(values)
    if t.dtype in (torch.bool,) or t.is_floating_point() or t.is_complex():
        raise TypeError(f"{name} must hold integer positions; got dtype {t.dtype}")
    return t.long()


class _GlobalTokens(Mask):
    uses = frozenset({"q", "kv"})

    def __init__(self, idx):
        self.idx = _index_tensor("idx", idx).flatten()
        if self.idx.numel() and int(self.idx.min()) < 0:
            raise ValueError(f"global token positions must be >= 0; got {self.idx.tolist()}")

    def _is_global(self, pos, length):
        lut = torch.zeros(length + 1, dtype=torch.bool, device=pos.device)
        idx = self.idx.to(pos.device)
        lut[idx[idx < length]] = True
        return lut[pos.clamp(0, length)]  # positions >= length map to the False sentinel

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        return self._is_global(q_idx, q_len) | self._is_global(kv_idx, kv_len)

    def _layout(self, q_len, kv_len, bs, device):
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
            raise TypeError(f"layout must be a bool tensor; got dtype {layout.dtype}")
        if not 2 <= layout.dim() <= 4:
            raise ValueError("layout must have shape (nq, nk), (H, nq, nk) or (B, H, nq, nk); "
                             f"got {tuple(layout.shape)}")
        self.layout = layout.reshape((1,) * (4 - layout.dim()) + tuple(layout.shape))
        self.block = _check_count("block_size", block_size, 1)
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

    def _layout(self, q_len, kv_len, bs, device):
        nq, nk = -(-q_len // bs), -(-kv_len // bs)
        if bs == self.block and nq <= self.layout.shape[2] and nk <= self.layout.shape[3]:
            lay = self.layout[:, :, :nq, :nk].to(device)
            return lay, lay
        return self._evaluated_layout(q_len, kv_len, bs, device)

    def __repr__(self):
        return f"block_layout(shape={tuple(self.layout.shape)}, block_size={self.block})"


def _per_batch(name, t, dim_name):
    """Normalise a per-position tensor to (B|1, L) and report its batch size."""
    if t.dim() == 1:
        return t[None], None
    if t.dim() == 2:
        return t, t.shape[0]
    raise ValueError(f"{name} must have shape ({dim_name},) or (batch, {dim_name}); got {tuple(t.shape)}")


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
            raise ValueError(f"q_ids and kv_ids must share a batch size; got {qb} and {kb}")
        self.batch_size = qb or kb
        self.uses = frozenset({"q", "kv"} | ({"b"} if self.batch_size else set()))

    def _ids(self, ids, b, idx, length):
        if ids.shape[1] < length:
            raise ValueError(f"segment ids cover {ids.shape[1]} positions but the sequence has {length}")
        ids = ids.to(idx.device)
        return ids[_rows(ids, b), idx.clamp(max=ids.shape[1] - 1)]

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        return self._ids(self.q_ids, b, q_idx, q_len) == self._ids(self.kv_ids, b, kv_idx, kv_len)

    def _layout(self, q_len, kv_len, bs, device):
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

    def __init__(self, lengths):
        self.lengths = _index_tensor("lengths", lengths).flatten()
        if self.lengths.numel() and int(self.lengths.min()) < 0:
            raise ValueError(f"lengths must be >= 0; got {self.lengths.tolist()}")
        self.batch_size = self.lengths.numel()

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        return kv_idx < self.lengths.to(kv_idx.device)[b]

    def _layout(self, q_len, kv_len, bs, device):
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

    def __init__(self, tensor: torch.Tensor):
        if tensor.dtype != torch.bool or tensor.dim() != 4:
            raise TypeError(f"TensorMask needs a 4-D bool tensor; got {tensor.dim()}-D {tensor.dtype}")
        self.tensor = tensor
        names = ("b", "h", "q", "kv")
        self.uses = frozenset(n for n, s in zip(names, tensor.shape, strict=True) if s > 1 or n == "kv")
        self.batch_size = tensor.shape[0] if tensor.shape[0] > 1 else None
        self.num_heads = tensor.shape[1] if tensor.shape[1] > 1 else None

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        t = self.tensor
        idx = [i if t.shape[d] > 1 else torch.zeros_like(i) for d, i in enumerate((b, h, q_idx, kv_idx))]
        return t[idx[0], idx[1], idx[2], idx[3]]

    def materialize(self, q_len, kv_len, *, batch=None, heads=None, device=None):
        return self.tensor.to(device) if device is not None else self.tensor

    def __repr__(self):
        return f"TensorMask(shape={tuple(self.tensor.shape)})"


class _FromFunction(Mask):
    def __init__(self, fn, name):
        if not callable(fn):
            raise TypeError(f"from_function needs a callable (b, h, q_idx, kv_idx) -> bool; got {type(fn).__name__}")
        self.fn, self.name = fn, name or getattr(fn, "__name__", "fn")

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        out = self.fn(b, h, q_idx, kv_idx)
        if not isinstance(out, torch.Tensor) or out.dtype != torch.bool:
            got = getattr(out, "dtype", type(out).__name__)
            raise TypeError(f"mask function {self.name!r} must return a bool tensor; got {got}")
        return out

    def __repr__(self):
        return f"from_function({self.name})"


class _PrefixLM(Mask):
    uses = frozenset({"q", "kv"})

    def __init__(self, n, align):
        self.n = _check_count("n", n)
        self.align = _check_align(align)
        self._inner = Or(_KeyRange(n), _Causal(align))

    def allows(self, *args):
        return self._inner.allows(*args)

    def _layout(self, q_len, kv_len, bs, device):
        return self._inner.block_layout(q_len, kv_len, bs, device=device)[:2]

    def __repr__(self):
        return f"prefix_lm({self.n}, align={self.align!r})"


class _KeyRange(_Band):
    """Keys ``j < n`` for every query (the bidirectional prefix of a prefix LM)."""

    def __init__(self, n):
        self.n = n

    def bounds(self, q_idx, q_len, kv_len):
        return torch.zeros_like(q_idx), torch.full_like(q_idx, self.n - 1)

    def __repr__(self):
        return f"key_range(0, {self.n})"


# ------------------------------------------------------------------ public API
def full() -> Mask:
    """Every query attends to every key."""
    return _Full()


def causal(align: str = "bottom_right") -> Mask:
    """Query i sees keys ``j <= i + Lk - Lq`` (bottom_right) or ``j <= i`` (top_left)."""
    return _Causal(align)


def sliding_window(left: int, right: int = 0, *, align: str = "bottom_right") -> Mask:
    """Query i sees keys ``i' - left <= j <= i' + right`` where ``i'`` is i aligned as in causal."""
    return _SlidingWindow(left, right, align)


def dilated(window: int, dilation: int, *, align: str = "bottom_right") -> Mask:
    """Keys ``i' + t * dilation`` for ``|t| <= window`` (Longformer's dilated window)."""
    return _Dilated(window, dilation, align)


def strided(stride: int) -> Mask:
    """Sparse Transformer "strided" pattern (Child et al. 2019, arXiv:1904.10509, Sec. 4.2).

    Keys with ``|i - j| < stride`` or ``(i - j) % stride == 0``. Combine with
    ``causal()`` for the paper's autoregressive form.
    """
    return _Strided(stride)


def fixed(block: int, summary: int = 1) -> Mask:
    """Sparse Transformer "fixed" pattern (Child et al. 2019, Sec. 4.2).

    Keys in the query's own block of ``block`` positions, plus the last ``summary``
    positions of every block. Combine with ``causal()`` for the paper's form.
    """
    return _Fixed(block, summary)


def global_tokens(idx: Sequence[int] | torch.Tensor) -> Mask:
    """Positions in ``idx`` see every key and are seen by every query (Longformer)."""
    return _GlobalTokens(idx)


def block_layout(layout: torch.Tensor, block_size: int) -> Mask:
    """Query block I sees key block J where ``layout[..., I, J]``.

    ``layout`` is bool ``(nq, nk)``, ``(H, nq, nk)`` or ``(B, H, nq, nk)``.
    """
    return _BlockLayoutMask(layout, block_size)


def segments(q_ids, kv_ids=None) -> Mask:
    """Same id attends (documents packed in one sequence); ids ``(L,)`` or ``(B, L)``."""
    return _Segments(q_ids, kv_ids)


def padding(lengths) -> Mask:
    """Per batch element b, keys ``j < lengths[b]`` (key padding; True = attend)."""
    return _Padding(lengths)


def keys(keep: torch.Tensor) -> Mask:
    """Keys to keep, a bool tensor ``(Lk,)`` or ``(B, Lk)``: True = may be attended."""
    keep = torch.as_tensor(keep)
    if keep.dtype != torch.bool:
        raise TypeError(f"keep must be a bool tensor (True = attend); got dtype {keep.dtype}")
    if keep.dim() not in (1, 2):
        raise ValueError(f"keep must have shape (kv_len,) or (batch, kv_len); got {tuple(keep.shape)}")
    keep = keep.reshape((1,) * (2 - keep.dim()) + tuple(keep.shape))
    return TensorMask(keep[:, None, None, :])


def prefix_lm(n: int, *, align: str = "bottom_right") -> Mask:
    """Prefix LM: every query sees the first ``n`` keys; the rest is causal."""
    return _PrefixLM(n, align)


def from_function(fn: Callable, name: str | None = None) -> Mask:
    """Any predicate ``fn(b, h, q_idx, kv_idx) -> bool tensor`` (elementwise, broadcasting)."""
    return _FromFunction(fn, name)

