"""Masks whose keys are named per query by index tensors: selected keys or key blocks, and paged caches.

Data-dependent sparse attentions choose, for every query, the keys it reads: DeepSeek's
lightning indexer the top-k keys (DeepSeek-AI 2025, arXiv:2512.02556, eq. 2), Native Sparse
Attention the top-n key blocks shared by a group of heads (Yuan et al. 2025,
arXiv:2502.11089, eq. 10-11), MoBA the top-k blocks by mean key (Lu et al. 2025,
arXiv:2502.13189, eq. 5-6). A paged KV cache is the same picture with one selection per
sequence: the page table lists the key blocks (pages) of the sequence, in order. These
masks are of kind ``"selected"``: the execution paths gather the named keys instead of
scanning a block layout, so their cost grows with ``Lq * k``, never with ``Lq * Lk``.

Every mask here answers :meth:`~attnkit.masks.base.Mask.allows` too (a dense
membership table, built on first use and cached): the dense paths stay exact oracles.
"""

from __future__ import annotations

import torch

from ..errors import ArgumentError, BackendError, DeviceError, DTypeError, ShapeError, check_int
from . import cache
from .base import Mask
from .indexed import gather_at

__all__ = ["Selection", "SelectedKeys", "Pages"]

_TABLES = 4  # dense membership tables kept per mask (key lengths)


def _int_tensor(who: str, name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype in (torch.bool,) or t.is_floating_point() or t.is_complex():
        got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
        raise DTypeError(f"{who}: {name} must be an integer tensor; got {got}")
    return t


def _distinct(indices: torch.Tensor) -> torch.Tensor:
    """Each row's indices sorted, repeats and negatives as -1: a key named twice is still one key."""
    if indices.shape[-1] < 2:
        return indices.clamp(min=-1)
    ordered = indices.sort(-1).values  # a fresh tensor: filled in place (four operations in all)
    ordered[..., 1:].masked_fill_(ordered[..., 1:] == ordered[..., :-1], -1)  # (the comparison is made first)
    return ordered.clamp_(min=-1)


class Selection(Mask):
    """What the gathered paths read from a mask of kind ``"selected"`` (see :attr:`selection`).

    ``indices`` ``(B|1, Hs|1, Lq|1, n)`` int64: key block ids (-1: an unused slot), block
    ``block_size`` keys wide; index head ``s`` serves the query heads ``[s g, (s + 1) g)``
    (``g = group_size``; one index head serves them all). ``lengths`` ``(B,)`` or None:
    with lengths the keys are in *logical* positions (slot ``s``, lane ``l`` is key
    ``s * block_size + l`` of the sequence, valid below ``lengths[b]``) and ``within`` is
    evaluated there; without, a slot's keys are the physical keys ``idx * block_size + l``.
    """

    kind = "selected"
    indices: torch.Tensor

    def check_keys(self, kv_len: int, who: str) -> None:
        """Refuse indices past ``kv_len`` keys (:class:`SelectedKeys`); a page table is checked at the call."""
    block_size: int = 1
    group_size: int | None = None
    lengths: torch.Tensor | None = None
    within: Mask | None = None

    @property
    def selection(self) -> Selection:
        return self

    @property
    def rest(self) -> Mask | None:
        """The mask beside the selection, evaluated on physical positions (None: nothing else)."""
        return None

    def index_head(self, h: torch.Tensor) -> torch.Tensor:
        """The index head serving query head ``h``."""
        if self.indices.shape[1] == 1:
            return torch.zeros_like(h)
        return h // self.group_size


def selection_of(mask: Mask | None) -> Selection:
    """The :class:`Selection` a mask of kind ``"selected"`` reads from: the mask itself, or the selected part of an
    AND of masks (its ``selection``)."""
    sel = getattr(mask, "selection", None)
    assert isinstance(sel, Selection), f"a mask of kind 'selected' carries a selection; got {mask!r}"
    return sel


class SelectedKeys(Selection):
    """Query ``i`` of head ``h`` in batch ``b`` may attend the keys of blocks ``indices[b, h // g, i, :]``.

    Built by :func:`attnkit.masks.selected_keys` (``block_size`` 1) and
    :func:`attnkit.masks.selected_blocks`. Combine with other masks by ``&`` (causality,
    padding): the result stays of kind ``"selected"`` and the gathered paths evaluate the
    other parts on the gathered keys only.
    """

    def __init__(self, indices, block_size: int = 1, *, group_size: int | None = None, distinct: bool = False):
        """``distinct``: the rows name distinct keys by construction (a top-k, -1 for unused slots), so the sort
        that merges repeats is skipped and the rows are kept as given, uncopied (for producers inside attnkit)."""
        who = "selected_keys" if block_size == 1 else "selected_blocks"
        indices = _int_tensor(who, "indices", indices)
        if not 2 <= indices.dim() <= 4:
            raise ShapeError(f"{who}: indices must have shape (Lq, k), (B, Lq, k) or (B, H, Lq, k); "
                             f"got {tuple(indices.shape)}")
        if indices.dim() == 3:
            indices = indices.unsqueeze(1)
        indices = indices.reshape((1,) * (4 - indices.dim()) + tuple(indices.shape)).long()
        self.indices = indices if distinct else _distinct(indices)
        self.block_size = check_int(who, "block_size", block_size, 1)
        heads = self.indices.shape[1]
        if group_size is not None:
            check_int(who, "group_size", group_size, 1)
        self.group_size = (group_size or 1) if heads > 1 else None
        self.uses = frozenset({"q", "kv"} | ({"b"} if self.indices.shape[0] > 1 else set())
                              | ({"h"} if heads > 1 else set()))
        self.batch_size = self.indices.shape[0] if self.indices.shape[0] > 1 else None
        self.num_heads = heads * self.group_size if heads > 1 else None
        self.q_len = self.indices.shape[2] if self.indices.shape[2] > 1 else None
        self._largest: int | None = None  # the largest index, read on the first check (check_keys)

    def check_keys(self, kv_len: int, who: str) -> None:
        """Refuse an index past the last key (block) of ``kv_len`` keys, naming ``indices``.

        The keys' count is known only at a call (or a materialisation), so that is where it is
        checked: the largest index is read once per mask (cached), and not while compiling.
        """
        if self.indices.is_meta or not self.indices.numel() or torch.compiler.is_compiling():
            return
        if self._largest is None:
            self._largest = int(self.indices.max())
        blocks = -(-kv_len // self.block_size)
        if self._largest >= blocks:
            unit = "key" if self.block_size == 1 else f"block of {self.block_size} keys"
            raise ArgumentError(f"{who}: {self!r}: indices must name a {unit} in [0, {blocks}) for kv_len={kv_len} "
                                f"(negative entries are unused slots); got {self._largest}")

    def _table(self, kv_len: int, device) -> torch.Tensor:
        """``(B|1, Hs|1, Lq|1, n_blocks)`` bool: the blocks each query selected (cached per key length)."""
        self.check_keys(kv_len, "materialize")

        def build():
            blocks = -(-kv_len // self.block_size)
            idx = self.indices.to(device)
            slot = torch.where((idx >= 0) & (idx < blocks), idx, blocks)  # out of range: a column cut away
            table = torch.zeros(*idx.shape[:3], blocks + 1, dtype=torch.bool, device=device)
            return table.scatter_(3, slot, True)[..., :blocks]
        return cache.on(self, "tables", max_entries=_TABLES).get_or_build((kv_len, str(device)), build)

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        table = self._table(kv_len, kv_idx.device)
        return gather_at(table, b, self.index_head(h), q_idx, kv_idx // self.block_size)

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        """Key blocks of size ``bs`` touched by each query block's selected blocks (``full`` never claimed)."""
        idx = self.indices.to(device)
        if idx.shape[1] > 1:
            idx = idx.repeat_interleave(self.group_size, 1)  # one layout row per query head
        nq, nk = -(-q_len // bs), -(-kv_len // bs)
        shared = idx.shape[2] == 1  # one selection for every query
        rows = torch.arange(idx.shape[2], device=device) // bs
        where = (torch.arange(idx.shape[0], device=device).view(-1, 1, 1, 1).expand(idx.shape),
                 torch.arange(idx.shape[1], device=device).view(1, -1, 1, 1).expand(idx.shape),
                 rows.view(1, 1, -1, 1).expand(idx.shape))
        active = torch.zeros(*idx.shape[:2], 1 if shared else nq, nk + 1, dtype=torch.bool, device=device)
        for edge in (0, self.block_size - 1):  # a selected block spans at most two kernel blocks
            key = torch.where(idx >= 0, (idx * self.block_size + edge).clamp(0, max(kv_len - 1, 0)) // bs, nk)
            active.index_put_((*where, key.clamp(max=nk)), torch.ones((), dtype=torch.bool, device=device))
        active = active[..., :nk].expand(*idx.shape[:2], nq, nk) if shared else active[..., :nk]
        return active, torch.zeros_like(active)

    def __repr__(self):
        name = "selected_keys" if self.block_size == 1 else f"selected_blocks(block_size={self.block_size}, "
        shape = tuple(self.indices.shape)
        return f"selected_keys(indices={shape})" if self.block_size == 1 else f"{name}indices={shape})"


class Pages(Selection):
    """Keys read through a page table: sequence ``b`` holds ``lengths[b]`` keys on pages ``table[b, :]``, in order.

    The keys and values are a pool of pages seen as one long key axis (page ``p`` holds
    the keys ``p * page_size ... (p + 1) * page_size - 1`` of the pool); the logical key
    ``t`` of sequence ``b`` is pool key ``table[b, t // page_size] * page_size + t % page_size``.
    ``within`` (a mask such as :func:`attnkit.masks.causal`) is evaluated at logical positions
    with ``kv_len = lengths[b]``, so bottom-right causality aligns each sequence's queries to
    the end of its own keys. Built by :func:`attnkit.attention` from ``block_table=`` and
    ``seqused_k=`` (:mod:`attnkit.functional.validate`).
    """

    uses = frozenset({"b", "q", "kv"})

    def __init__(self, table: torch.Tensor, page_size: int, lengths: torch.Tensor, within: Mask | None = None,
                 *, pooled: bool = True):
        self.pooled = pooled  # the keys are one pool of pages shared by the batch (else one cache per sequence)
        self.table = table.long()
        self.indices = self.table[:, None, None, :]  # one selection per sequence, every head and query
        self.block_size = page_size
        self.lengths = lengths.long()
        self.within = within
        self.batch_size = table.shape[0]
        if within is not None:
            self.uses = self.uses | (within.uses & {"h"})
            self.num_heads = within.num_heads

    def _slots(self, pool_pages: int, device) -> torch.Tensor:
        """``(B, pool_pages)``: the slot of each pool page in each sequence's table (-1: not its page)."""
        def build():
            batch, n = self.table.shape
            used = (torch.arange(n, device=device) * self.block_size < self.lengths.to(device)[:, None])
            page = torch.where(used, self.table.to(device), pool_pages).clamp(0, pool_pages)
            if not torch.compiler.is_compiling():
                _refuse_repeats(page, pool_pages)
            slots = torch.full((batch, pool_pages + 1), -1, dtype=torch.long, device=device)
            slots.scatter_(1, page, torch.arange(n, device=device).expand(batch, n))
            return slots[:, :pool_pages]
        return cache.on(self, "tables", max_entries=_TABLES).get_or_build((pool_pages, str(device)), build)

    def held(self, b, kv_idx, kv_len):
        """``(whether pool key kv holds a key of sequence b, its logical position)``: a page of b, below its length."""
        ps = self.block_size
        slot = self._slots(-(-kv_len // ps), kv_idx.device)[b, kv_idx // ps]
        logical = slot * ps + kv_idx % ps
        return (slot >= 0) & (logical < self.lengths.to(kv_idx.device)[b]), logical

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        allowed, logical = self.held(b, kv_idx, kv_len)
        if self.within is not None:
            allowed = allowed & self.within.allows(b, h, q_idx, logical, q_len, self.lengths.to(kv_idx.device)[b])
        return allowed

    def key_padding(self) -> Mask:
        """The pool keys no query of sequence ``b`` may read (other sequences' pages, spare pages, lanes past its
        length): the paths that read the whole pool zero them when it holds NaN or inf (RELIABILITY row 22)."""
        return _HeldKeys(self)

    def __repr__(self):
        within = "" if self.within is None else f", within={self.within!r}"
        return f"pages(table={tuple(self.table.shape)}, page_size={self.block_size}{within})"


def _refuse_repeats(page: torch.Tensor, pool_pages: int) -> None:
    """A sequence naming a page twice among its pages in use holds two positions on it: one key of the pool seen as
    one axis would stand for both, so the paths that see it so (every one but ``paged-split-kv``) refuse."""
    counts = torch.zeros(page.shape[0], pool_pages + 1, dtype=torch.long, device=page.device)
    counts.scatter_add_(1, page, torch.ones_like(page))[:, pool_pages] = 0  # (the column of entries not in use)
    if page.numel() and int(counts.max()) > 1:
        b, twice = divmod(int(counts.argmax()), pool_pages + 1)
        raise BackendError(f"attnkit.attention: block_table names page {twice} more than once among sequence {b}'s "
                           "pages in use; only the paged path (backend='auto' without return_weights) reads a page "
                           "once for each time it is named, the others see the pool as one key axis")


class _HeldKeys(Mask):
    """The pool keys that hold one of sequence ``b``'s keys (:meth:`Pages.key_padding`)."""

    uses = frozenset({"b", "kv"})

    def __init__(self, pages: Pages):
        self.pages, self.batch_size = pages, pages.batch_size

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        return self.pages.held(b, kv_idx, kv_len)[0]

    def __repr__(self):
        return f"held_keys({self.pages!r})"


def check_lengths(who: str, lengths, batch: int, device, longest: int, bound: str,
                  values: bool = True) -> torch.Tensor:
    """``seqused_k`` ``(batch,)``: the keys each sequence holds, an integer tensor on ``device``.

    With ``values`` the entries are read and must lie in ``[0, longest]`` (``bound`` names what
    ``longest`` is). The one check of these lengths, for paged calls and packed documents alike.
    """
    lengths = _int_tensor(who, "seqused_k", lengths)
    if tuple(lengths.shape) != (batch,):
        raise ShapeError(f"{who}: seqused_k must have shape (batch={batch},); got {tuple(lengths.shape)}")
    if lengths.device != device:
        raise DeviceError(f"{who}: seqused_k is on {lengths.device} but query is on {device}")
    if values and batch:
        low, high = int(lengths.min()), int(lengths.max())
        if low < 0 or high > longest:
            raise ArgumentError(f"{who}: seqused_k must lie in [0, {bound} = {longest}]; got values "
                                f"in [{low}, {high}]")
    return lengths


def check_pages(who: str, table, lengths, pool_pages: int, page_size: int, batch: int, device,
                values: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``block_table`` ``(B, n)`` and ``seqused_k`` ``(B,)`` checked against a pool of ``pool_pages`` pages.

    With ``values`` the entries are read: lengths in ``[0, n * page_size]`` and the pages a
    sequence uses in ``[0, pool_pages)`` (entries past a sequence's length are never read).
    """
    table = _int_tensor(who, "block_table", table)
    if table.dim() != 2 or table.shape[0] != batch:
        raise ShapeError(f"{who}: block_table must have shape (batch={batch}, max_pages); got {tuple(table.shape)}")
    if table.device != device:
        raise DeviceError(f"{who}: block_table is on {table.device} but query is on {device}")
    longest = table.shape[1] * page_size
    lengths = check_lengths(who, lengths, batch, device, longest, "max_pages * page_size", values=False)
    if values and batch:  # read in one sync (a decoding step pays this check every call)
        used = torch.arange(table.shape[1], device=device) * page_size < lengths[:, None]
        low, high, lowest, highest = torch.stack(  # page 0 stands for the entries not in use
            [*torch.aminmax(lengths.long()), *torch.aminmax(torch.where(used, table, 0).long())]).tolist()
        if low < 0 or high > longest:
            raise ArgumentError(f"{who}: seqused_k must lie in [0, max_pages * page_size = {longest}]; got values "
                                f"in [{low}, {high}]")
        if (lowest < 0 or highest >= pool_pages) and (pool_pages or high > 0):  # (an empty pool: no page in use)
            pages = table[used]
            raise ArgumentError(f"{who}: block_table entries of the pages in use must lie in [0, {pool_pages}) (the "
                                f"pool's pages); got values in [{int(pages.min())}, {int(pages.max())}]")
    return table, lengths
