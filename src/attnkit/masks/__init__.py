"""The built-in masks: each a function of indices, True = attend (``from attnkit import masks``).

The protocol every mask follows (:class:`Mask`, ``&``, ``|``, ``~``, block layouts) is in
:mod:`attnkit.masks.base`; masks that hold tensors (segments, padding, key lists,
bool tensors) in :mod:`attnkit.masks.indexed`. :func:`shifted` reads a mask at
global positions (a block of a longer sequence), :func:`parse` builds one from its text.

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

from ..errors import ArgumentError, DTypeError, check_int
from . import parsing as mask_parse
from .base import And, BlockLayout, Mask, Not, Or, _block_bounds
from .flex_tiles import from_block_mask
from .indexed import (
    _FAR,
    TensorMask,
    _BlockLayoutMask,
    _FromFunction,
    _GlobalTokens,
    _Padding,
    _Segments,
)
from .selected import SelectedKeys, selection_of
from .tree import TreeMask

__all__ = [
    "Mask", "BlockLayout", "And", "Or", "Not", "TensorMask", "ShiftedMask",
    "full", "causal", "sliding_window", "diagonals", "dilated", "strided", "fixed", "global_tokens",
    "block_layout", "segments", "padding", "keys", "prefix_lm", "from_function", "parse",
    "shifted", "from_block_mask", "selected_keys", "selected_blocks", "tree",
]

_ALIGNMENTS = ("bottom_right", "top_left")
_WIDEST = 1 << 40  # a span (window, stride, block) no sequence reaches: larger ones are refused, not overflowed


def _check_align(align: str) -> str:
    if align not in _ALIGNMENTS:
        raise ArgumentError(f"align must be one of {_ALIGNMENTS}; got {align!r}")
    return align


def _span(name: str, value, minimum: int = 0) -> int:
    """An int span in ``[minimum, 2**40]``: index arithmetic on larger values would overflow int64."""
    value = check_int(None, name, value, minimum)
    if value > _WIDEST:
        raise ArgumentError(f"{name} must be at most 2**40 (more than any sequence length); got {value}")
    return value


def _diagonal(name: str, value) -> int:
    """A diagonal offset in ``[-2**40, 2**40]``."""
    value = check_int(None, name, value, -_WIDEST)
    if value > _WIDEST:
        raise ArgumentError(f"{name} must be at most 2**40 (more than any sequence length); got {value}")
    return value


def _offset(align: str, q_len: int, kv_len: int) -> int:
    return kv_len - q_len if align == "bottom_right" else 0


def _shift(align: str) -> int:
    """The ``shift`` of a band term: 1 when the band moves with ``kv_len - q_len`` (bottom-right alignment)."""
    return 1 if align == "bottom_right" else 0


class _Band(Mask):
    """Keys ``lo(i) <= j <= hi(i)`` with bounds that grow with ``i``: exact analytic layout."""

    uses = frozenset({"q", "kv"})

    def bounds(self, q_idx, q_len, kv_len):
        raise NotImplementedError

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        lo, hi = self.bounds(q_idx, q_len, kv_len)
        return (kv_idx >= lo) & (kv_idx <= hi)

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        q_first, q_last = _block_bounds(q_len, bs, device)
        k_first, k_last = _block_bounds(kv_len, bs, device)
        lo_first, hi_first = self.bounds(q_first, q_len, kv_len)
        lo_last, hi_last = self.bounds(q_last, q_len, kv_len)
        col = lambda t: t.view(-1, 1)
        active = (col(lo_first) <= k_last) & (col(hi_last) >= k_first) & (col(lo_first) <= col(hi_last))
        full = (col(lo_last) <= k_first) & (col(hi_first) >= k_last)
        return active[None, None], full[None, None]


class _Causal(_Band):
    kind = "causal"

    def __init__(self, align):
        self.align = _check_align(align)
        self.band_terms = ((), ((0, _shift(align)),))
        self.text = f"causal(align={self.align!r})"

    def bounds(self, q_idx, q_len, kv_len):
        return torch.full_like(q_idx, -_FAR), q_idx + _offset(self.align, q_len, kv_len)


class _SlidingWindow(_Band):
    kind = "band"

    def __init__(self, left, right, align):
        self.left, self.right = _span("left", left), _span("right", right)
        self.align = _check_align(align)
        self.band_terms = (((-self.left, _shift(align)),), ((self.right, _shift(align)),))
        self.text = f"sliding_window(left={self.left}, right={self.right}, align={self.align!r})"

    def bounds(self, q_idx, q_len, kv_len):
        pos = q_idx + _offset(self.align, q_len, kv_len)
        return pos - self.left, pos + self.right


class _Dilated(_SlidingWindow):
    """Every ``dilation``-th key within ``window`` steps: a band with holes."""

    def __init__(self, window, dilation, align):
        self.window = _span("window", window)
        self.dilation = _span("dilation", dilation, 1)
        super().__init__(_span("window * dilation", window * dilation), window * dilation, align)
        if self.dilation > 1:  # holes: not a band
            self.kind, self.band_terms = "pattern", None
        self.text = f"dilated(window={self.window}, dilation={self.dilation}, align={self.align!r})"

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        pos = q_idx + _offset(self.align, q_len, kv_len)
        return super().allows(b, h, q_idx, kv_idx, q_len, kv_len) & ((pos - kv_idx) % self.dilation == 0)

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        active, full = super()._layout(q_len, kv_len, bs, device)
        return active, full if self.dilation == 1 else torch.zeros_like(full)


class _Strided(Mask):
    uses = frozenset({"q", "kv"})

    def __init__(self, stride):
        self.stride = _span("stride", stride, 1)
        self.text = f"strided({self.stride})"

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        delta = q_idx - kv_idx
        return (delta.abs() < self.stride) | (delta % self.stride == 0)

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        """Exact, from the range ``[lo, hi]`` of ``i - j`` over a block (every value in it occurs)."""
        q_first, q_last = _block_bounds(q_len, bs, device)
        k_first, k_last = _block_bounds(kv_len, bs, device)
        lo, hi = q_first[:, None] - k_last[None, :], q_last[:, None] - k_first[None, :]
        near = (lo < self.stride) & (hi > -self.stride)
        multiple = torch.div(hi, self.stride, rounding_mode="floor") * self.stride >= lo
        full = ((lo >= -self.stride) & (hi <= self.stride)) | ((lo == hi) & (lo % self.stride == 0))
        return (near | multiple)[None, None], (full | (self.stride == 1))[None, None]


class _Fixed(Mask):
    uses = frozenset({"q", "kv"})

    def __init__(self, block, summary):
        self.block = _span("block", block, 1)
        self.summary = _span("summary", summary, 1)
        if summary > block:
            raise ArgumentError(f"summary must be <= block; got summary={summary}, block={block}")
        self.text = f"fixed(block={self.block}, summary={self.summary})"
        self.fixed_terms = (self.block, self.summary)  # And reads it (causal() & fixed(): Mask.causal_fixed); so does
        # rules.fixed_terms, for fixed() alone

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        same_block = (q_idx // self.block) == (kv_idx // self.block)
        summary_key = (kv_idx % self.block) >= self.block - self.summary
        return same_block | summary_key

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        """Exact: a block pair is active where the blocks of ``block`` positions meet or a summary key is in it."""
        q_first, q_last = (t // self.block for t in _block_bounds(q_len, bs, device))
        k_first, k_last = (t // self.block for t in _block_bounds(kv_len, bs, device))
        nk = -(-kv_len // bs)
        j = torch.arange(nk * bs, device=device)
        summary, real = (j % self.block) >= self.block - self.summary, j < kv_len
        plain = (real & ~summary).view(nk, bs)  # keys only the query's own block of positions sees
        any_summary = (real & summary).view(nk, bs).any(1)
        far = -(-nk * bs // self.block) + 1  # a block id no position has
        plain_lo = torch.where(plain, (j // self.block).view(nk, bs), far).amin(1)
        plain_hi = torch.where(plain, (j // self.block).view(nk, bs), -far).amax(1)
        meet = (q_first[:, None] <= k_last[None, :]) & (k_first[None, :] <= q_last[:, None])
        one = (q_first == q_last)[:, None]  # the query block lies in one block of positions
        full = ~plain.any(1)[None, :] | (one & (plain_lo[None, :] == q_first[:, None]) & (
            plain_hi[None, :] == q_first[:, None]))
        return (meet | any_summary[None, :])[None, None], full[None, None]


class _Full(Mask):
    uses = frozenset()
    kind = "full"
    band_terms = ((), ())
    text = "full()"

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        """True, one size-1 dim per dim of the indices (broadcast as the other masks' answers; not 0-d)."""
        dims = max(t.dim() for t in (b, h, q_idx, kv_idx) if isinstance(t, torch.Tensor))
        return torch.ones((1,) * dims, dtype=torch.bool, device=q_idx.device)

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        shape = (1, 1, -(-q_len // bs), -(-kv_len // bs))
        ones = torch.ones(shape, dtype=torch.bool, device=device)
        return ones, ones


class _PrefixLM(Mask):
    uses = frozenset({"q", "kv"})

    def __init__(self, n, align):
        self.n = _span("n", n)
        self.align = _check_align(align)
        self._inner = Or(_KeyRange(n), _Causal(align))
        self.text = f"prefix_lm({self.n}, align={self.align!r})"

    def allows(self, *args):
        return self._inner.allows(*args)

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        return self._inner.block_layout(q_len, kv_len, bs, device=device, batch=sizes[0], heads=sizes[1])[:2]


class _Diagonals(_Band):
    """Keys ``lo <= j - i <= hi`` (a side is open when None), positions counted from the first query and key."""

    kind = "band"

    def __init__(self, lo, hi):
        self.lo = None if lo is None else _diagonal("lo", lo)
        self.hi = None if hi is None else _diagonal("hi", hi)
        self.band_terms = (() if self.lo is None else ((self.lo, 0),), () if self.hi is None else ((self.hi, 0),))
        self.text = f"diagonals(lo={self.lo}, hi={self.hi})"

    def bounds(self, q_idx, q_len, kv_len):
        lo = torch.full_like(q_idx, -_FAR) if self.lo is None else q_idx + self.lo
        hi = torch.full_like(q_idx, _FAR) if self.hi is None else q_idx + self.hi
        return lo, hi


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


def diagonals(lo: int | None = None, hi: int | None = None) -> Mask:
    """Query i sees keys ``lo <= j - i <= hi`` (None: that side is open), with no alignment shift.

    The general band: ``diagonals(hi=d)`` is a causal mask whose keys run ``d`` positions
    ahead of the queries (a KV cache holding ``d`` earlier tokens), ``diagonals(-w + 1, 0)``
    a causal window of ``w`` keys.

    Example:
        >>> from attnkit import masks
        >>> masks.diagonals(-1, 1).materialize(3, 4)[0, 0].int().tolist()
        [[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1]]
    """
    return _Diagonals(lo, hi)


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
        raise DTypeError(f"keep must be a bool tensor (True = attend); got dtype {keep.dtype}")
    if keep.dim() not in (1, 2):
        raise ArgumentError(f"keep must have shape (kv_len,) or (batch, kv_len); got {tuple(keep.shape)}")
    keep = keep.reshape((1,) * (2 - keep.dim()) + tuple(keep.shape))
    return TensorMask(keep[:, None, None, :])


def tree(parents) -> TreeMask:
    """A speculative draft tree, bottom-right over a cache: node ``i`` sees the committed keys and its ancestors.

    ``parents`` ``(T,)`` or ``(B, T)`` integers: ``parents[i]`` is node ``i``'s parent, ``-1`` for a root, and
    precedes it (``parents[i] < i``). The last ``T`` keys and queries are the nodes; earlier query rows are
    causal (:mod:`attnkit.masks.tree`). A chain ``[-1, 0, 1, ...]`` is :func:`causal`.

    Example:
        >>> from attnkit import masks
        >>> masks.tree([-1, 0, 0]).materialize(3, 5)[0, 0].int().tolist()
        [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 1]]
    """
    return TreeMask(parents)


def prefix_lm(n: int, *, align: str = "bottom_right") -> Mask:
    """Prefix LM: every query sees the first ``n`` keys; the rest is causal."""
    return _PrefixLM(n, align)


def from_function(fn: Callable, name: str | None = None) -> Mask:
    """Any predicate ``fn(b, h, q_idx, kv_idx) -> bool tensor`` (elementwise, broadcasting)."""
    return _FromFunction(fn, name)


def selected_keys(indices: torch.Tensor, *, group_size: int | None = None) -> Mask:
    """Query ``i`` sees the keys ``indices[..., i, :]`` (top-k selection, DeepSeek-AI 2025, arXiv:2512.02556, eq. 2).

    ``indices`` are integers ``(Lq, k)``, ``(B, Lq, k)`` or ``(B, Hs, Lq, k)``; a negative entry is an
    unused slot and a key named twice is one key. An index past the last key is refused (``ArgumentError``)
    where the key count is first known: the call (or :meth:`materialize`, :func:`shifted`). With
    ``Hs > 1`` index heads, index head ``s`` serves the query heads ``[s * group_size, (s + 1) * group_size)``
    (``group_size`` 1 by default: one selection per query head; the query heads of a key/value group
    share one with ``group_size = H // H_kv``). Data dependent: the gathered path reads each query's ``k`` keys, at a
    cost ``O(Lq k D)``; AND it with :func:`causal` for causality.

    Example:
        >>> import torch
        >>> m = selected_keys(torch.tensor([[0, 2], [1, -1], [2, 0]]))
        >>> m.materialize(3, 4)[0, 0].int().tolist()
        [[1, 0, 1, 0], [0, 1, 0, 0], [1, 0, 1, 0]]
    """
    return SelectedKeys(indices, 1, group_size=group_size)


def selected_blocks(indices: torch.Tensor, block_size: int, *, group_size: int | None = None) -> Mask:
    """Query ``i`` sees the key blocks ``indices[..., i, :]`` of ``block_size`` keys each (NSA, MoBA).

    Shapes, ``group_size`` and the refusal of an index past the last block as :func:`selected_keys`; block
    ``j`` holds keys ``j * block_size ... (j + 1) * block_size - 1`` (Yuan et al. 2025, arXiv:2502.11089, eq. 10-11;
    Lu et al. 2025, arXiv:2502.13189, eq. 5-6).

    Example:
        >>> import torch
        >>> m = selected_blocks(torch.tensor([[0], [1], [0]]), 2)
        >>> m.materialize(3, 4)[0, 0].int().tolist()
        [[1, 1, 0, 0], [0, 0, 1, 1], [1, 1, 0, 0]]
    """
    return SelectedKeys(indices, block_size, group_size=group_size)


class ShiftedMask(Mask):
    """``parent`` read at global indices: ``allows(b, h, i, j) = parent.allows(b, h + h0, i + q0, j + k0, Lq, Lk)``.

    The data the parent holds (segment ids, padding lengths, dense tensors) is for the
    whole problem, so the shifted mask ties itself to no length or head count; the
    batch is not split and keeps the parent's batch size.
    """

    def __init__(self, parent: Mask, *, q0: int, k0: int, h0: int, q_len: int, kv_len: int):
        self.parent, self.q0, self.k0, self.h0 = parent, q0, k0, h0
        self.global_q_len, self.global_kv_len = q_len, kv_len
        if parent.kind == "selected":  # indices name global keys: the global length is known here
            selection_of(parent).check_keys(kv_len, "masks.shifted")
        self.uses = parent.uses
        self.batch_size = parent.batch_size
        band = parent.band(q_len, kv_len)
        if band is not None:  # the global band at its global lengths, moved: local j - i = global (j - i) - d
            d = k0 - q0
            self.band_terms = tuple(() if edge is None else ((edge - d, 0),) for edge in band)
        self.kind = parent.kind if parent.kind in ("full", "keys", "pattern") else (
            "band" if band is not None else "pattern")

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        return self.parent.allows(b, h + self.h0, q_idx + self.q0, kv_idx + self.k0,
                                  self.global_q_len, self.global_kv_len)

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        band = self.band(q_len, kv_len)
        if band is not None and self.uses <= {"q", "kv"}:  # analytic, from the shifted band
            return diagonals(*band).block_layout(q_len, kv_len, bs, device=device)[:2]
        return self._evaluated_layout(q_len, kv_len, bs, device, sizes)

    def key_padding(self):
        part = self.parent.key_padding()
        return None if part is None else _shifted_like(part, self)

    def __repr__(self):
        return f"shifted({self.parent!r}, q0={self.q0}, k0={self.k0}, h0={self.h0})"


def _shifted_like(mask: Mask, like: ShiftedMask) -> ShiftedMask:
    return ShiftedMask(mask, q0=like.q0, k0=like.k0, h0=like.h0, q_len=like.global_q_len,
                       kv_len=like.global_kv_len)


def shifted(mask: Mask | None, *, q0: int = 0, k0: int = 0, h0: int = 0, q_len: int, kv_len: int) -> Mask | None:
    """The block of ``mask`` at rows ``q0 + i``, keys ``k0 + j``, heads ``h0 + h`` of a ``q_len x kv_len`` problem.

    A sequence split over processes, or decoded over a KV cache, computes one block of the
    whole problem's scores: rows ``[q0, q0 + Lq)``, keys ``[k0, k0 + Lk)``, heads from ``h0``.
    A mask written for the whole sequence is read there at global positions. A band
    ``lo <= j - i <= hi`` stays a band (shifted by ``k0 - q0``), so band kernels still read
    contiguous key windows; a band whose block is the plain lower triangle is returned as
    ``causal("top_left")``, so the common diagonal block takes the O(1) path. None stays None.

    Example:
        >>> m = shifted(causal(), q0=4, k0=2, q_len=8, kv_len=8)
        >>> m.materialize(2, 2)[0, 0].int().tolist()   # global rows 4-5 against keys 2-3
        [[1, 1], [1, 1]]
        >>> shifted(causal(), q0=4, k0=4, q_len=8, kv_len=8)
        causal(align='top_left')
    """
    if mask is None:
        return None
    block = ShiftedMask(mask, q0=q0, k0=k0, h0=h0, q_len=q_len, kv_len=kv_len)
    if mask.uses <= {"q", "kv"} and block.band(0, 0) == (None, 0):
        return causal("top_left")  # the block's rows and columns are square-aligned at the diagonal
    return block


_PARSEABLE = {name: globals()[name] for name in (
    "full", "causal", "sliding_window", "diagonals", "dilated", "strided", "fixed", "global_tokens", "segments",
    "padding", "prefix_lm")}


def parse(text: str) -> Mask:
    """Build the mask a text describes: calls of the constructors above with literal arguments, ``& | ~``.

    Example:
        >>> parse("causal() & sliding_window(2, 0)")
        (causal(align='bottom_right') & sliding_window(left=2, right=0, align='bottom_right'))
    """
    return mask_parse.parse(text, _PARSEABLE)
