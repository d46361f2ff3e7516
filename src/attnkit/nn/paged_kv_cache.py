"""A paged key/value cache: fixed-size pages shared across sequences, page tables, forks with copy on write."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..cascade import cascade_attention, explain_cascade
from ..core import attention, explain
from ..errors import ArgumentError, ShapeError, check_int
from ..functional.quantize import KVFormat, as_format
from ..masks import causal
from ._inputs import check_placement, check_shape

__all__ = ["PagedKVCache", "PagedBatch"]

_WHO = "PagedKVCache"


class PagedKVCache:
    """Keys and values of many sequences in one pool of pages, as serving systems keep them.

    Kwon et al. 2023, arXiv:2309.06180 (PagedAttention, Sec. 4.1-4.3): the cache is cut into
    pages of ``page_size`` positions; each sequence owns a *page table* listing its pages in
    order, so sequences grow without reserving their longest length, and a forked sequence
    (beam search, a shared prompt) shares its parent's pages until one of them writes into a
    shared page, which is then copied (copy on write). Attention reads the pages in place
    through the table: :meth:`attend` (or ``attnkit.attention(q, cache.k_pages,
    cache.v_pages, block_table=..., seqused_k=...)``, path ``paged-split-kv``), equal bit for
    bit to the same keys stored contiguously, ``attention(q, k, v, seqused_k=...)``.

    Differences from the paper: none in what is stored; a page is freed when no sequence
    holds it (reference counts); appending under autograd writes out of place, so gradients
    through several steps stay exact. A sequence's next page is the one after its last while
    that one is free (a new sequence starts halfway into the largest run of free pages), so
    sequences that grow in turn still hold consecutive pages, which attention reads in place;
    scattered pages are copied a chunk or a sequence at a time.

    With ``kv_format`` (:class:`~attnkit.functional.quantize.KVFormat`) the pools hold codes
    (``head_dim / 2`` bytes per row for int4) and the scale pools ``k_scales``/``v_scales``
    ``(num_pages, page_size, kv_heads)`` float32 (per tensor: ``()``, fixed by the first append);
    :meth:`append` quantizes, pages are copied on write with their scales, and :meth:`attend`
    passes the scales to :func:`attnkit.attention`, which dequantizes one chunk of pages at a time.

    Shapes:
        pools ``k_pages`` ``(num_pages, page_size, kv_heads, head_dim)``, ``v_pages`` (``v_head_dim``);
        ``append(seq, k (kv_heads, t, head_dim), v)``; ``block_table(seqs)`` ``(B, max_pages)``;
        ``attend(seqs, q (B, H, Lq, head_dim))`` -> ``(B, H, Lq, v_head_dim)``.

    Args:
        num_pages: pages in the pool.
        page_size: positions per page.
        kv_heads: key/value heads.
        head_dim: key feature size.
        v_head_dim: value feature size (default ``head_dim``).
        dtype: of the pools (default float32); quantized: of the appended keys and values.
        device: of the pools (default CPU).
        kv_format: None (full precision), a :class:`~attnkit.functional.quantize.KVFormat` or a kind's name.

    Example:
        >>> import torch
        >>> cache = PagedKVCache(8, 4, 2, 5)
        >>> seq = cache.allocate()
        >>> cache.append(seq, torch.ones(2, 6, 5), torch.ones(2, 6, 5))
        >>> child = cache.fork(seq)
        >>> cache.lengths([seq, child]).tolist(), cache.pages_free
        ([6, 6], 6)
        >>> cache.attend([seq, child], torch.randn(2, 4, 1, 5)).shape
        torch.Size([2, 4, 1, 5])
    """

    def __init__(self, num_pages: int, page_size: int, kv_heads: int, head_dim: int, *,
                 v_head_dim: int | None = None, dtype: torch.dtype | None = None, device=None,
                 kv_format: KVFormat | str | None = None):
        pages = check_int(_WHO, "num_pages", num_pages, 1)
        self.page_size = check_int(_WHO, "page_size", page_size, 1)
        heads = check_int(_WHO, "kv_heads", kv_heads, 1)
        d = check_int(_WHO, "head_dim", head_dim, 1)
        dv = d if v_head_dim is None else check_int(_WHO, "v_head_dim", v_head_dim, 1)
        self.kv_format = fmt = as_format(_WHO, kv_format)
        self._dims, self._dtype = (d, dv), dtype or torch.get_default_dtype()
        code = self._dtype if fmt is None else fmt.storage_dtype
        stored = (d, dv) if fmt is None else (fmt.stored_dim(d, _WHO), fmt.stored_dim(dv, _WHO, "v_head_dim"))
        self.k_pages = torch.zeros(pages, self.page_size, heads, stored[0], dtype=code, device=device)
        self.v_pages = torch.zeros(pages, self.page_size, heads, stored[1], dtype=code, device=device)
        token_head = fmt is not None and fmt.granularity == "token_head"
        self.k_scales = torch.zeros(pages, self.page_size, heads, device=device) if token_head else None
        self.v_scales = torch.zeros(pages, self.page_size, heads, device=device) if token_head else None
        self._refs = [0] * pages
        self._free = set(range(pages))  # placed by _place
        self._tables: dict[int, list[int]] = {}
        self._lengths: dict[int, int] = {}
        self._next_id = 0
        # a PrefixCache's eviction: called with the pages short before running out
        self._reclaim: Callable[[int], int] | None = None

    def __repr__(self) -> str:
        pages, ps, heads, _ = self.k_pages.shape
        fmt = "" if self.kv_format is None else f", kv_format={self.kv_format}"
        return (f"PagedKVCache(num_pages={pages}, page_size={ps}, kv_heads={heads}, head_dim={self._dims[0]}, "
                f"sequences={len(self._tables)}, pages_free={self.pages_free}{fmt})")

    @property
    def bytes_per_token(self) -> int:
        """Bytes one position takes: keys and values in the pools' dtype, or the format's codes and scales."""
        heads, (d, dv) = self.k_pages.shape[2], self._dims
        if self.kv_format is not None:
            return self.kv_format.bytes_per_token(heads, d, dv)
        return heads * (d + dv) * self.k_pages.element_size()

    @property
    def scales(self) -> dict[str, torch.Tensor]:
        """``{"k_scale": ..., "v_scale": ...}`` of the pools for ``attnkit.attention(..., block_table=, **scales)``:
        ``(num_pages, page_size, kv_heads)`` or ``()`` float32; empty for a full-precision cache."""
        if self.kv_format is None:
            return {}
        one = torch.ones((), device=self.k_pages.device)
        return {"k_scale": one if self.k_scales is None else self.k_scales,
                "v_scale": one if self.v_scales is None else self.v_scales}

    def __len__(self) -> int:
        return len(self._tables)

    @property
    def pages_free(self) -> int:
        return len(self._free)

    def _seq(self, seq: int) -> int:
        if seq not in self._tables:
            raise ArgumentError(f"{_WHO}: no sequence {seq!r}; live sequences are {sorted(self._tables)}")
        return seq

    def _take_page(self, after: int | None = None) -> int:
        """A free page for the sequence whose last page is ``after`` (None: it has none), see :meth:`_place`."""
        if not self._free and self._reclaim is not None:
            self._reclaim(1)
        if not self._free:
            raise ShapeError(f"{_WHO}: out of pages: all {len(self._refs)} pages of {self.page_size} positions are "
                             "in use; free sequences or make the cache with more num_pages")
        page = self._place(after)
        self._free.remove(page)
        self._refs[page] = 1
        return page

    def _place(self, after: int | None) -> int:
        """Where a sequence's next page goes: right after its last one when that page is free, so that its pages
        stay one run of the pool (which attention reads in place, with no copy); else in the largest run of free
        pages, at its start when it starts the pool, otherwise halfway in (the sequence whose page ends just
        before the run keeps the first half to grow into)."""
        if after is not None and after + 1 < len(self._refs) and self._refs[after + 1] == 0:
            return after + 1
        free = sorted(self._free)
        start, length, best = free[0], 0, (0, free[0])
        for i, page in enumerate(free):
            if i and page != free[i - 1] + 1:
                start, length = page, 0
            length += 1
            if length > best[0]:
                best = (length, start)
        length, start = best
        return start if start == 0 else start + length // 2

    def _release(self, page: int) -> None:
        self._refs[page] -= 1
        if self._refs[page] == 0:
            self._free.add(page)

    def allocate(self) -> int:
        """A new empty sequence; returns its id."""
        seq, self._next_id = self._next_id, self._next_id + 1
        self._tables[seq], self._lengths[seq] = [], 0
        return seq

    def fork(self, seq: int) -> int:
        """A new sequence holding ``seq``'s positions on the same pages (shared until written: copy on write)."""
        table = self._tables[self._seq(seq)]
        child = self.allocate()
        for page in table:
            self._refs[page] += 1
        self._tables[child], self._lengths[child] = list(table), self._lengths[seq]
        return child

    def free(self, seq: int) -> None:
        """Forget ``seq``; its pages return to the pool once no other sequence holds them."""
        for page in self._tables.pop(self._seq(seq)):
            self._release(page)
        del self._lengths[seq]

    def length(self, seq: int) -> int:
        return self._lengths[self._seq(seq)]

    def batch(self, seqs) -> PagedBatch:
        """The sequences ``seqs`` as one layer's cache of a model call, batch row ``b`` on ``seqs[b]``
        (:class:`PagedBatch`)."""
        return PagedBatch(self, seqs)

    def _check(self, name: str, t, pool: torch.Tensor) -> None:
        who = f"{_WHO}.append"
        check_placement(who, name, t, dtype=self._dtype, device=pool.device, owner="the cache")
        heads, d = pool.shape[2], self._dims[0 if name == "k" else 1]
        check_shape(who, name, t, lambda t: t.dim() == 3 and (t.shape[0], t.shape[2]) == (heads, d),
                    f"have shape (kv_heads={heads}, new_len, {d})")

    def _writable_pages(self, seq: int, stop: int) -> list[int]:
        """The pages positions ``[length, stop)`` of ``seq`` go to: new pages, and a copy of a shared last page."""
        table, start, ps = self._tables[seq], self._lengths[seq], self.page_size
        if start % ps and self._refs[table[-1]] > 1:  # writing into a page another sequence holds: copy it
            page = self._take_page(table[-2] if len(table) > 1 else None)
            self.k_pages[page], self.v_pages[page] = self.k_pages[table[-1]], self.v_pages[table[-1]]
            if self.k_scales is not None and self.v_scales is not None and self.k_scales.dim():  # per (token, head)
                self.k_scales[page], self.v_scales[page] = self.k_scales[table[-1]], self.v_scales[table[-1]]
            self._release(table[-1])
            table[-1] = page
        needed = -(-stop // ps) - len(table)
        if needed > self.pages_free and self._reclaim is not None:
            self._reclaim(needed - self.pages_free)
        if needed > self.pages_free:
            raise ShapeError(f"{_WHO}.append: out of pages: sequence {seq} needs {needed} more pages for length "
                             f"{stop}, {self.pages_free} of {len(self._refs)} are free")
        for _ in range(needed):
            table.append(self._take_page(table[-1] if table else None))
        return table

    def append(self, seq: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store ``t`` new positions of ``seq`` after its current ones (exactly: no cast)."""
        self._seq(seq)
        self._check("k", k, self.k_pages)
        self._check("v", v, self.v_pages)
        if k.shape[1] != v.shape[1]:
            raise ShapeError(f"{_WHO}.append: k and v must add the same number of positions; got k "
                             f"{tuple(k.shape)} and v {tuple(v.shape)}")
        start = self._lengths[seq]
        stop = start + k.shape[1]
        where = self._where(self._writable_pages(seq, stop), start, stop)
        if self.kv_format is not None:
            self._append_codes(where, k, v)
        elif torch.is_grad_enabled() and any(t.requires_grad for t in (k, v, self.k_pages, self.v_pages)):
            self.k_pages = self.k_pages.index_put(where, k.transpose(0, 1))  # out of place: earlier graphs keep
            self.v_pages = self.v_pages.index_put(where, v.transpose(0, 1))  # the pools they saw
        else:
            self.k_pages[where] = k.transpose(0, 1)
            self.v_pages[where] = v.transpose(0, 1)
        self._lengths[seq] = stop

    def _where(self, table: list[int], start: int, stop: int):
        """(page, lane) of positions ``[start, stop)`` of a sequence whose pages are ``table``."""
        device = self.k_pages.device
        pages, pos = torch.tensor(table, dtype=torch.long, device=device), torch.arange(start, stop, device=device)
        return pages[pos // self.page_size], pos % self.page_size

    def truncate(self, seq: int, length: int) -> None:
        """Keep the first ``length`` positions of ``seq`` (rejected draft tokens dropped); pages past them return to
        the pool once no other sequence holds them, and a shared last page is copied before it is written."""
        length = check_int(f"{_WHO}.truncate", "length", length, 0)
        if length > self.length(seq):
            raise ArgumentError(f"{_WHO}.truncate: length must be at most the {self._lengths[seq]} positions of "
                                f"sequence {seq}; got {length}")
        table = self._tables[seq]
        for page in table[-(-length // self.page_size):]:
            self._release(page)
        del table[-(-length // self.page_size):]
        self._lengths[seq] = length

    def commit(self, seq: int, tree, nodes) -> None:
        """Keep a root-to-node path ``nodes`` of the draft ``tree`` (its nodes: the last positions of ``seq``;
        a per-sequence tree's row ``seq``'s place in the batch is not known here: give its own row's tree) and
        drop the other nodes, as :meth:`attnkit.nn.KVCache.commit`: ``seq`` then holds what a plain decode of
        the path stores."""
        from ..masks.tree import TreeMask

        who = f"{_WHO}.commit"
        if not isinstance(tree, TreeMask) or tree.batch_size not in (None, 1):
            raise ArgumentError(f"{who}: tree must be an attnkit.masks.tree of one sequence's parents; got {tree!r}")
        start = self.length(seq) - tree.nodes
        if start < 0:
            raise ShapeError(f"{who}: the tree's {tree.nodes} nodes must be the last positions of sequence {seq}; it "
                             f"holds {self._lengths[seq]}")
        path = tree.check_path(who, nodes)
        table = self._tables[seq]
        read = self._where(table, start, start + tree.nodes)
        rows = [t[read[0][path], read[1][path]] for t in self._stored()] if path else []
        self.truncate(seq, start)
        write = self._where(self._writable_pages(seq, start + len(path)), start, start + len(path))
        for t, r in zip(self._stored(), rows, strict=False):
            t[write] = r
        self._lengths[seq] = start + len(path)

    def _stored(self) -> list[torch.Tensor]:
        """The pools a position is stored in: keys, values and their per (token, head) scales."""
        return [t for t in (self.k_pages, self.v_pages, self.k_scales, self.v_scales) if t is not None and t.dim()]

    def _append_codes(self, where, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize and store new positions (a per-tensor scale is fixed by the cache's first append)."""
        assert self.kv_format is not None  # a quantized cache
        for name, t in (("k", k), ("v", v)):
            scales = getattr(self, f"{name}_scales")
            fixed = scales if scales is not None and scales.dim() == 0 else None
            codes, scale = self.kv_format.quantize(t, fixed)  # (kv_heads, t, E), (kv_heads, t) or ()
            getattr(self, f"{name}_pages")[where] = codes.transpose(0, 1)
            if scale.dim():
                scales[where] = scale.transpose(0, 1)
            else:
                setattr(self, f"{name}_scales", scale)

    def block_table(self, seqs) -> torch.Tensor:
        """``(B, max_pages)`` int64: each sequence's pages in order (unused entries 0, never read)."""
        tables = [self._tables[self._seq(s)] for s in seqs]
        width = max((len(t) for t in tables), default=0)
        rows = [t + [0] * (width - len(t)) for t in tables]
        return torch.tensor(rows, dtype=torch.long, device=self.k_pages.device).view(len(rows), width)

    def lengths(self, seqs) -> torch.Tensor:
        """``(B,)`` int64: the positions each sequence holds."""
        return torch.tensor([self._lengths[self._seq(s)] for s in seqs], dtype=torch.long,
                            device=self.k_pages.device)

    def attend(self, seqs, q: torch.Tensor, *, mask=None, scale: float | None = None, cascade: bool | None = None,
               **kwargs) -> torch.Tensor:
        """``attention(q, k_pages, v_pages, ...)`` over the sequences ``seqs`` (one per row of ``q``).

        ``mask`` defaults to :func:`attnkit.masks.causal` (bottom-right: the queries are each
        sequence's last ``Lq`` positions: decoding, chunked prefill); other keywords go to
        :func:`attnkit.attention`.

        Shared prefixes: when the sequences begin on the same pages (forks of one prompt, prefix-cache
        hits) the causal call runs as :func:`attnkit.cascade_attention`: the shared pages are read once for
        every sequence's queries, each sequence's own pages once, merged by log-sum-exp (``sinks`` joined
        after). ``cascade=None`` takes it whenever two or more sequences share at least one whole page
        before their queries (full precision, default mask, no keyword but ``sinks``), ``False`` never;
        :meth:`explain` says which.
        """
        seqs = list(seqs)
        if q.dim() != 4 or q.shape[0] != len(seqs):
            raise ShapeError(f"{_WHO}.attend: q must be (B={len(seqs)}, heads, Lq, head_dim), one row per sequence; "
                             f"got {tuple(q.shape)}")
        shared = self._shared_prefix(seqs, q.shape[2], mask, kwargs) if cascade is not False else 0
        if shared:
            *parts, lengths = self._split_at(seqs, shared)
            return cascade_attention(q, *parts, suffix_lengths=lengths, scale=scale, **kwargs)
        scales: dict[str, Any] = self.scales  # keywords of attention, beside the caller's
        return attention(q, self.k_pages, self.v_pages, block_table=self.block_table(seqs),
                         seqused_k=self.lengths(seqs), mask=causal() if mask is None else mask, scale=scale,
                         **scales, **kwargs)

    def explain(self, seqs, q: torch.Tensor, *, mask=None, cascade: bool | None = None, **kwargs):
        """What :meth:`attend` with these arguments runs: the :class:`~attnkit.cascade.CascadePlan` (the shared
        prefix read once) when it takes the cascade, else :func:`attnkit.explain`'s decision for the paged call."""
        seqs = list(seqs)
        shared = self._shared_prefix(seqs, q.shape[2], mask, kwargs) if cascade is not False else 0
        if shared:
            *parts, lengths = self._split_at(seqs, shared)
            return explain_cascade(q, *parts, suffix_lengths=lengths, **kwargs)
        scales: dict[str, Any] = self.scales  # keywords of explain, beside the caller's
        return explain(q, self.k_pages, self.v_pages, block_table=self.block_table(seqs),
                       seqused_k=self.lengths(seqs), mask=causal() if mask is None else mask, **scales, **kwargs)

    def _shared_prefix(self, seqs, lq: int, mask, kwargs) -> int:
        """Whole pages (a count) every sequence of ``seqs`` begins with and holds before its last ``lq`` positions;
        0 where :meth:`attend` must not take the cascade."""
        sinks = kwargs.get("sinks")
        if len(seqs) < 2 or mask is not None or self.kv_format is not None or set(kwargs) - {"sinks"} or (
                sinks is not None and (not isinstance(sinks, torch.Tensor) or sinks.dim() != 1)):
            return 0  # (sinks per sequence, (B, H), go the ordinary way)
        tables = [self._tables[self._seq(s)] for s in seqs]
        room = min(self._lengths[s] for s in seqs) - lq  # positions before every sequence's queries
        pages = 0
        while (pages + 1) * self.page_size <= room and all(
                len(t) > pages and t[pages] == tables[0][pages] for t in tables):
            pages += 1
        return pages

    def _split_at(self, seqs, pages: int):
        """The shared ``pages``' keys and values ``(kv_heads, P, D)`` (gathered once) and each sequence's rest
        ``(B, kv_heads, S, D)`` padded to the longest, with its lengths: :func:`attnkit.cascade_attention`'s
        ``prefix_k, prefix_v, suffix_k, suffix_v`` and ``suffix_lengths``."""
        table, ps = self._tables[seqs[0]], self.page_size

        def gather(pool, page_ids, n):  # (kv_heads, n, D) of the first n positions on the pages
            return pool[torch.tensor(page_ids, dtype=torch.long, device=pool.device)].flatten(0, 1)[:n].transpose(0, 1)
        prefix = [gather(pool, table[:pages], pages * ps) for pool in (self.k_pages, self.v_pages)]
        rest = [self._lengths[s] - pages * ps for s in seqs]
        suffix = []
        for pool in (self.k_pages, self.v_pages):
            rows = [gather(pool, self._tables[s][pages:], n) for s, n in zip(seqs, rest, strict=True)]
            suffix.append(torch.stack([torch.nn.functional.pad(r, (0, 0, 0, max(rest) - r.shape[1])) for r in rows]))
        return (*prefix, *suffix, torch.tensor(rest))


class PagedBatch:
    """Sequences of a :class:`PagedKVCache` as one layer's cache in a model (``TransformerLM``, ``step``,
    ``verify``, ``commit``): batch row ``b`` appends to and reads sequence ``seqs[b]`` through its page table.

    A model keeps one pool per softmax layer (``[pool.batch(seqs) for pool in pools]``); the rows must hold
    equally many positions (as a :class:`~attnkit.nn.KVCache`'s rows: ``len()`` is that number). ``append(k, v)``
    ``(B, H_kv, t, D)``; ``attend(q, mask=, scale=)`` ``(B, H, Lq, D)`` is :meth:`PagedKVCache.attend`;
    ``commit(tree, nodes)`` keeps a draft tree's accepted path in every row, as :meth:`KVCache.commit`.
    """

    def __init__(self, cache: PagedKVCache, seqs):
        who = "PagedBatch"
        if not isinstance(cache, PagedKVCache):
            raise ArgumentError(f"{who}: cache must be a PagedKVCache; got {type(cache).__name__}")
        self.cache, self.seqs = cache, [cache._seq(s) for s in seqs]
        if not self.seqs or len(set(self.seqs)) != len(self.seqs):
            raise ArgumentError(f"{who}: seqs must name one distinct sequence per batch row; got {list(seqs)}")

    def __len__(self) -> int:
        lengths = {self.cache.length(s) for s in self.seqs}
        if len(lengths) > 1:
            raise ShapeError(f"PagedBatch: a model's batch rows must hold equally many positions; sequences "
                             f"{self.seqs} hold {[self.cache.length(s) for s in self.seqs]}")
        return lengths.pop()

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        if k.dim() != 4 or v.dim() != 4 or k.shape[0] != len(self.seqs) or v.shape[0] != len(self.seqs):
            raise ShapeError(f"PagedBatch.append: k and v must be (B={len(self.seqs)}, kv_heads, t, head_dim), one "
                             f"row per sequence; got {tuple(k.shape)} and {tuple(v.shape)}")
        for b, seq in enumerate(self.seqs):
            self.cache.append(seq, k[b], v[b])

    def attend(self, q: torch.Tensor, *, mask=None, scale: float | None = None, **kwargs) -> torch.Tensor:
        return self.cache.attend(self.seqs, q, mask=mask, scale=scale, **kwargs)

    def commit(self, tree, nodes) -> None:
        """Keep the root-to-node path ``nodes`` (one list, or one per row, all as long) of the draft ``tree`` (one
        tree, or one per row) whose nodes are each sequence's last positions; drop the other nodes."""
        from ..masks.tree import TreeMask

        who = "PagedBatch.commit"
        if not isinstance(tree, TreeMask):
            raise ArgumentError(f"{who}: tree must be an attnkit.masks.tree(parents); got {type(tree).__name__}")
        batch = len(self.seqs)
        rows = [list(nodes)] * batch if not nodes or not isinstance(nodes[0], (list, tuple)) else list(nodes)
        if len(rows) != batch or len({len(r) for r in rows}) > 1:
            raise ShapeError(f"{who}: nodes must be one path, or one per batch row ({batch}) all as long; got "
                             f"{[len(r) for r in rows]} paths' lengths")
        for b, (seq, path) in enumerate(zip(self.seqs, rows, strict=True)):
            own = tree if tree.batch_size in (None, 1) else TreeMask(tree.parents[b])
            self.cache.commit(seq, own, path)
