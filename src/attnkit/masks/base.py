"""The :class:`Mask` protocol, its combinators and block layouts.

A mask is a predicate over indices, ``allows(b, h, q_idx, kv_idx) -> bool``,
True = may attend. The index arguments are integer tensors that broadcast against
each other (for a dense picture ``b`` is ``(B,1,1,1)``, ``h`` ``(1,H,1,1)``,
``q_idx`` ``(1,1,Lq,1)``, ``kv_idx`` ``(1,1,1,Lk)``; kernels pass gathered index
tensors of other ranks), so every mask is written with elementwise tensor ops; a mask
(or bias) that holds a ``(B|1, H|1, Lq|1, Lk|1)`` tensor reads it at those indices with
:func:`gather_at`.

A mask can be *materialized* as a dense bool tensor (the reference path, plots)
or summarised as a :class:`BlockLayout` for a block size, which is what lets the
block-sparse kernel skip empty blocks without ever building an ``Lq x Lk`` tensor.
"""

from __future__ import annotations

from functools import cached_property
from typing import NamedTuple

import torch

from ..errors import ArgumentError, DTypeError
from . import cache

__all__ = ["Mask", "BlockLayout", "And", "Or", "Not", "KINDS", "gather_at"]

KINDS = ("full", "causal", "band", "keys", "tensor", "pattern", "selected")  # Mask.kind, what kernels read

# Query rows evaluated at once when a layout has to be computed by brute force.
_EVAL_ROWS_BUDGET = 1 << 22
# Layouts kept per mask (most recently used first): a few lengths x block sizes; a generation loop
# over thousands of lengths keeps only the latest ones.
LAYOUT_CACHE_ENTRIES = 16


def gather_at(t: torch.Tensor, b, h, q_idx, kv_idx) -> torch.Tensor:
    """``t[b, h, q_idx, kv_idx]`` for a 4-D tensor whose size-1 dims broadcast."""
    idx = [i if t.shape[d] != 1 else torch.zeros_like(i) for d, i in enumerate((b, h, q_idx, kv_idx))]
    return t[idx[0], idx[1], idx[2], idx[3]]


class BlockLayout(NamedTuple):
    """Block summary of a mask for one block size.

    ``active[..., I, J]`` is True when query block ``I`` may attend to some key of
    key block ``J`` (an over-approximation is allowed: an active block whose
    entries all turn out masked costs time, never correctness). ``full[..., I, J]``
    is True only when every in-range entry of the block is allowed (an
    under-approximation is allowed), so the kernel can skip evaluating the mask
    there. Both are bool tensors of shape ``(B|1, H|1, ceil(Lq/bs), ceil(Lk/bs))``.
    """

    active: torch.Tensor
    full: torch.Tensor
    block_size: int

    @property
    def density(self) -> float:
        """Fraction of (query block, key block) pairs that must be computed."""
        return self.active.float().mean().item() if self.active.numel() else 0.0


def _block_bounds(length: int, block_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """First and last in-range index of every block of a length."""
    first = torch.arange(0, length, block_size, device=device)
    last = torch.clamp(first + block_size - 1, max=length - 1)
    return first, last


class Mask:
    """Base class: a predicate over ``(b, h, q_idx, kv_idx)``, True = attend.

    Subclasses implement :meth:`allows` and may override :meth:`_layout` with an
    analytic block layout; the default evaluates the predicate block by block
    (``O(Lq * Lk)`` work, bounded memory). Masks are immutable: tensors they hold
    must not be modified in place after construction (layouts are cached, bounded).

    Attributes:
        uses: which of ``"b", "h", "q", "kv"`` the predicate reads.
        batch_size: batch size the mask is tied to (per-sample data), else None.
        num_heads: number of heads the mask is tied to, else None.
        q_len, kv_len: sequence lengths the mask's data is for (tensor masks,
            segment ids), else None; attention() checks them against the inputs.
        kind: what kernels read to choose how to run the mask, one of :data:`KINDS`:
            ``"full"`` (every key), ``"causal"`` (:func:`attnkit.masks.causal`, with its
            ``align``), ``"band"`` (exactly the keys ``lo <= j - i <= hi``: :meth:`band`),
            ``"keys"`` (reads no query index: key padding, per-head key masks),
            ``"tensor"`` (a bool tensor), ``"pattern"`` (any other function of indices),
            ``"selected"`` (keys named per query by index tensors, alone or AND-ed with other
            masks: ``selection`` holds the indices, ``rest`` the other parts;
            :mod:`attnkit.masks.selected`).
        band_terms: how :meth:`band` depends on the lengths, as data (no call into the
            mask): ``(lo_terms, hi_terms)``, each a tuple of ``(const, shift)`` with
            ``lo = max(const + shift * (kv_len - q_len))`` (``hi``: min); an empty tuple is
            an open side; None: not a band.
        causal_fixed: ``(block, summary)`` when the mask is exactly ``causal() & fixed(block, summary)``
            (the Sparse Transformer's fixed pattern, in either order), else None: the ``fixed-blocks``
            path reads it (:mod:`attnkit.kernels.fixed_blocks`).
        text: the text :func:`attnkit.masks.parse` rebuilds the mask from (its ``repr``,
            computed once), or None for masks holding tensors or functions. Compiled and
            exported graphs carry a mask as this text.
    """

    uses: frozenset = frozenset({"b", "h", "q", "kv"})
    kind: str = "pattern"
    band_terms: tuple | None = None
    causal_fixed: tuple[int, int] | None = None
    text: str | None = None
    batch_size: int | None = None
    num_heads: int | None = None
    q_len: int | None = None
    kv_len: int | None = None

    def allows(self, b, h, q_idx, kv_idx, q_len: int, kv_len: int) -> torch.Tensor:
        """Bool tensor, True where query ``q_idx`` may attend key ``kv_idx``."""
        raise NotImplementedError

    # ----------------------------------------------------------------- algebra
    def __and__(self, other: Mask) -> Mask:
        return And(self, _as_mask(other))

    def __or__(self, other: Mask) -> Mask:
        return Or(self, _as_mask(other))

    def __invert__(self) -> Mask:
        return Not(self)

    def __repr__(self) -> str:
        return self.text if self.text is not None else f"{type(self).__name__}()"

    @property
    def textual(self) -> bool:
        """Whether :attr:`text` rebuilds this mask (no tensor or function inside)."""
        return self.text is not None

    # -------------------------------------------------------- dense pictures
    def materialize(self, q_len: int, kv_len: int, *, batch: int | None = None,
                    heads: int | None = None, device=None) -> torch.Tensor:
        """Dense bool tensor ``(B|1, H|1, Lq, Lk)``; size-1 where the mask ignores b/h.

        ``batch``/``heads`` default to the sizes the mask is tied to, else 1.
        """
        batch = batch if batch is not None else (1 if self.batch_size is None else self.batch_size)
        heads = heads if heads is not None else (1 if self.num_heads is None else self.num_heads)
        b = torch.arange(batch if "b" in self.uses else 1, device=device).view(-1, 1, 1, 1)
        h = torch.arange(heads if "h" in self.uses else 1, device=device).view(1, -1, 1, 1)
        qi = torch.arange(q_len, device=device).view(1, 1, -1, 1)
        ki = torch.arange(kv_len, device=device).view(1, 1, 1, -1)
        allowed = self.allows(b, h, qi, ki, q_len, kv_len)
        shape = (b.shape[0], h.shape[1], q_len, kv_len)
        return torch.broadcast_to(allowed, shape)

    # ----------------------------------------------------------- block layouts
    def block_layout(self, q_len: int, kv_len: int, block_size: int, *, device=None, exact: bool = False,
                     batch: int | None = None, heads: int | None = None) -> BlockLayout:
        """The :class:`BlockLayout` for a block size (cached per sizes and device).

        ``batch``/``heads`` are the problem's sizes, needed by masks that read ``b``
        or ``h`` without holding per-sample data (``from_function``). With
        ``exact=True`` the layout is computed by evaluating every entry, so
        ``active`` is exactly "some entry allowed" and ``full`` exactly "all allowed".
        """
        if block_size < 1:
            raise ArgumentError(f"block_size must be >= 1; got {block_size}")
        sizes = (self.batch_size or batch or 1 if "b" in self.uses else 1,
                 self.num_heads or heads or 1 if "h" in self.uses else 1)
        key = (q_len, kv_len, block_size, str(device), exact, sizes)
        fn = self._evaluated_layout if exact else self._layout
        return cache.on(self, "layouts", max_entries=LAYOUT_CACHE_ENTRIES).get_or_build(
            key, lambda: BlockLayout(*fn(q_len, kv_len, block_size, device, sizes), block_size))

    def _layout(self, q_len, kv_len, block_size, device, sizes=(1, 1)):
        return self._evaluated_layout(q_len, kv_len, block_size, device, sizes)

    def _evaluated_layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        """Exact layout by evaluating the predicate, a band of query blocks at a time."""
        nq, nk = -(-q_len // bs), -(-kv_len // bs)
        batch, heads = sizes
        b = torch.arange(batch, device=device).view(-1, 1, 1, 1)
        h = torch.arange(heads, device=device).view(1, -1, 1, 1)
        ki = torch.arange(nk * bs, device=device).view(1, 1, 1, -1)
        rows_per_step = max(1, _EVAL_ROWS_BUDGET // max(1, batch * heads * nk * bs * bs))
        active = [torch.zeros(batch, heads, 0, nk, dtype=torch.bool, device=device)]
        full = list(active)
        for start in range(0, nq, rows_per_step):
            stop = min(nq, start + rows_per_step)
            qi = torch.arange(start * bs, stop * bs, device=device).view(1, 1, -1, 1)
            # Padding lanes are evaluated at the last real index, then excluded by in_range.
            allowed = torch.broadcast_to(
                self.allows(b, h, qi.clamp(max=q_len - 1), ki.clamp(max=kv_len - 1), q_len, kv_len),
                (batch, heads, qi.shape[2], nk * bs))
            in_range = (qi < q_len) & (ki < kv_len)
            blocks = (batch, heads, stop - start, bs, nk, bs)
            active.append((allowed & in_range).reshape(blocks).any(5).any(3))
            full.append((allowed | ~in_range).reshape(blocks).all(5).all(3))
        return torch.cat(active, 2), torch.cat(full, 2)

    def to_block_mask(self, q_len: int, kv_len: int, *, batch: int | None = None, heads: int | None = None,
                      block_size: int = 128, device=None, exact: bool = False):
        """This mask as FlexAttention's ``BlockMask`` (:func:`attnkit.masks.block_masks.to_block_mask`)."""
        from .block_masks import to_block_mask
        return to_block_mask(self, q_len, kv_len, batch=batch, heads=heads, block_size=block_size, device=device,
                             exact=exact)

    # ------------------------------------------------------------- helpers
    def band(self, q_len: int, kv_len: int) -> tuple[int | None, int | None] | None:
        """``(lo, hi)`` when the mask allows exactly the keys ``lo <= j - i <= hi`` (None: that side is open).

        None when the mask is not such a band. A band lets a kernel read each query
        block's keys as one contiguous window instead of gathering key blocks. Read
        from :attr:`band_terms`: arithmetic on data, the same code for every mask.
        """
        terms = self.band_terms
        if terms is None:
            return None
        offset = kv_len - q_len
        los, his = terms
        return (max(c + s * offset for c, s in los) if los else None,
                min(c + s * offset for c, s in his) if his else None)

    def cached_bytes(self) -> int:
        """Bytes held by the caches on this mask and on the masks it is made of (layouts, plans, biases)."""
        held = 0
        for value in vars(self).values():  # the mask's caches, and masks it holds (parts, a parent, an inner mask)
            for item in value if isinstance(value, tuple) else (value,):
                held += (item.bytes_held if isinstance(item, cache.BoundedCache) else
                         item.cached_bytes() if isinstance(item, Mask) else 0)
        return held

    def key_padding(self) -> Mask | None:
        """The key-padding part of this mask: a mask reading only ``b`` and ``kv`` that this mask implies, if any.

        Keys it rejects are rejected for every query (padding), so kernels may
        zero those K/V rows: non-finite values there can then never leak.
        """
        return self if not (self.uses & {"q", "h"}) else None

    @cached_property
    def pads_keys(self) -> bool:
        """Whether :meth:`key_padding` finds a part: asked once, then read as data (a mask is immutable), so a call
        on a mask without key padding asks the mask nothing (:func:`attnkit.kernels.dispatch.execute`)."""
        return self.key_padding() is not None


def _as_mask(other) -> Mask:
    if not isinstance(other, Mask):
        raise DTypeError(f"masks combine only with other attnkit masks; got {type(other).__name__}")
    return other


def _merge_owner(masks, attr):
    sizes = [size for size in (getattr(m, attr) for m in masks) if size is not None]  # no set: a traced size is
    if any(size != sizes[0] for size in sizes[1:]):  # a SymInt, which does not hash
        raise ArgumentError(f"combined masks disagree on {attr}: {sorted(set(sizes))}")
    return sizes[0] if sizes else None


class _Combined(Mask):
    """A logical combination; ``&`` and ``|`` chains are flattened (``a & b & c`` is one And of three)."""

    symbol = ""

    def __init__(self, *parts: Mask):
        flat = []
        for part in parts:
            flat.extend(part.parts if type(part) is type(self) and self.symbol else (part,))
        self.parts = tuple(flat)
        self.uses = frozenset().union(*(p.uses for p in self.parts))
        self.batch_size = _merge_owner(self.parts, "batch_size")
        self.num_heads = _merge_owner(self.parts, "num_heads")
        self.q_len = _merge_owner(self.parts, "q_len")
        self.kv_len = _merge_owner(self.parts, "kv_len")
        if self.symbol and all(p.text is not None for p in self.parts):
            self.text = "(" + f" {self.symbol} ".join(p.text for p in self.parts) + ")"
        self.kind = "keys" if "q" not in self.uses else "pattern"

    def _part_layouts(self, q_len, kv_len, bs, device, sizes):
        return [p.block_layout(q_len, kv_len, bs, device=device, batch=sizes[0], heads=sizes[1])[:2]
                for p in self.parts]

    def __repr__(self):
        if self.text is not None:
            return self.text
        if not self.symbol:
            return f"~{self.parts[0]!r}"
        return "(" + f" {self.symbol} ".join(repr(p) for p in self.parts) + ")"


class And(_Combined):
    """Logical AND: allowed where every part allows (logical ops, never summed sentinels)."""

    symbol = "&"

    def __init__(self, *parts: Mask):
        super().__init__(*parts)
        terms = [p.band_terms for p in self.parts]
        if None not in terms:  # the intersection of bands: every part's bounds hold
            self.band_terms = (sum((lo for lo, _ in terms), ()), sum((hi for _, hi in terms), ()))
            self.kind = "full" if all(p.kind == "full" for p in self.parts) else "band"
        chosen = [p for p in self.parts if p.kind == "selected"]
        if chosen:  # a subset of the selected keys: gathered paths read the selection, then the other parts
            others = [p for p in self.parts if p is not chosen[0]]
            self.kind, self.selection = "selected", chosen[0].selection
            self.rest = others[0] if len(others) == 1 else And(*others)
            if chosen[0].rest is not None:
                self.rest = self.rest & chosen[0].rest
        fixed = [p for p in self.parts if getattr(p, "fixed_terms", None) is not None]
        if len(self.parts) == 2 and len(fixed) == 1 and any(p.kind == "causal" for p in self.parts):
            self.causal_fixed = fixed[0].fixed_terms  # causal() & fixed(block, summary)

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        allowed = self.parts[0].allows(b, h, q_idx, kv_idx, q_len, kv_len)
        for part in self.parts[1:]:
            allowed = allowed & part.allows(b, h, q_idx, kv_idx, q_len, kv_len)
        return allowed

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        layouts = self._part_layouts(q_len, kv_len, bs, device, sizes)
        active, full = layouts[0]
        for a, f in layouts[1:]:
            active, full = active & a, full & f  # active over-approximates; full is exact
        return active, full

    def key_padding(self):
        filters = [f for f in (p.key_padding() for p in self.parts) if f is not None]
        if not filters:
            return None
        return filters[0] if len(filters) == 1 else And(*filters)


class Or(_Combined):
    """Logical OR: allowed where some part allows."""

    symbol = "|"

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        allowed = self.parts[0].allows(b, h, q_idx, kv_idx, q_len, kv_len)
        for part in self.parts[1:]:
            allowed = allowed | part.allows(b, h, q_idx, kv_idx, q_len, kv_len)
        return allowed

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        layouts = self._part_layouts(q_len, kv_len, bs, device, sizes)
        active, full = layouts[0]
        for a, f in layouts[1:]:
            active, full = active | a, full | f  # active is exact; full under-approximates
        return active, full


class Not(_Combined):
    """Logical NOT: allowed where the part forbids. ``~~m`` is ``m`` itself."""

    def __init__(self, part: Mask):
        super().__init__(part)
        if part.text is not None:
            self.text = f"~{part.text}"

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        return ~self.parts[0].allows(b, h, q_idx, kv_idx, q_len, kv_len)

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        ((active, full),) = self._part_layouts(q_len, kv_len, bs, device, sizes)
        return ~full, ~active

    def __invert__(self) -> Mask:
        return self.parts[0]
