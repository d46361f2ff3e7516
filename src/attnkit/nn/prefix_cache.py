"""Prefix caching by content: a new sequence whose tokens begin like an earlier one's reuses its pages.

Serving systems keep the pages of finished or running requests indexed by the tokens they hold
(Kwon et al. 2023, vLLM's automatic prefix caching: a hash per block of the tokens up to it;
Zheng et al. 2024, SGLang, arXiv:2312.07104, RadixAttention: a radix tree over token sequences).
Here a whole page ``i`` of a sequence is keyed by its token prefix, chained: ``key_i = (the page
holding key_{i-1}, the page's tokens)`` (``-1`` before the first page). Two pages get one key exactly
when the token prefixes up to their ends are equal, so a lookup never trusts a hash collision; it is
the radix tree of SGLang with one page per edge.

:meth:`PrefixCache.insert` indexes a sequence's whole pages (the index then holds a reference: the
pages outlive the sequence, and a sequence writing into one copies it first, as any shared page of
:class:`~attnkit.nn.PagedKVCache`); :meth:`PrefixCache.match` starts a new sequence on the longest
indexed prefix of its tokens (shared, copy on write) and returns the positions it need not compute.
When the pool runs out of pages, the least recently used indexed pages that no sequence holds and
that no other indexed page continues are evicted (leaves first, as RadixAttention's LRU).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from ..errors import ArgumentError, DTypeError
from .paged_kv_cache import PagedKVCache

__all__ = ["PrefixCache"]

_WHO = "PrefixCache"


class PrefixCache:
    """The content index of a :class:`~attnkit.nn.PagedKVCache`'s pages (see the module).

    Counters: ``pages_reused`` (pages a :meth:`match` shared instead of recomputing), ``positions_reused``,
    ``pages_indexed``, ``pages_evicted``.

    Example:
        >>> import torch
        >>> cache = PagedKVCache(8, 2, 1, 4)
        >>> index = PrefixCache(cache)
        >>> a = cache.allocate()
        >>> cache.append(a, torch.randn(1, 5, 4), torch.randn(1, 5, 4))
        >>> index.insert(a, [7, 8, 9, 10, 11])
        >>> b, cached = index.match([7, 8, 9, 10, 3, 4])
        >>> cached, cache.block_table([a])[0, :2].tolist() == cache.block_table([b])[0].tolist()
        (4, True)
    """

    def __init__(self, cache: PagedKVCache):
        if not isinstance(cache, PagedKVCache):
            raise DTypeError(f"{_WHO}: cache must be a PagedKVCache; got {type(cache).__name__}")
        if cache._reclaim is not None:
            raise ArgumentError(f"{_WHO}: this PagedKVCache already has a prefix cache")
        self.cache = cache
        self._index: dict[tuple, int] = {}  # (previous page or -1, the page's tokens) -> page
        self._key: dict[int, tuple] = {}  # page -> its key
        self._children: dict[int, int] = {}  # page -> indexed pages continuing it
        self._lru: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.pages_reused = self.positions_reused = self.pages_indexed = self.pages_evicted = 0
        cache._reclaim = self.evict

    def __len__(self) -> int:
        return len(self._index)

    def _tokens(self, who: str, tokens) -> list[int]:
        if isinstance(tokens, torch.Tensor):
            if tokens.dim() != 1 or tokens.is_floating_point():
                raise DTypeError(f"{who}: tokens must be a 1-D integer sequence; got {tokens.dtype} "
                                 f"{tuple(tokens.shape)}")
            return tokens.tolist()
        return [int(t) for t in tokens]

    def insert(self, seq: int, tokens) -> None:
        """Index ``seq``'s whole pages; ``tokens`` are the ids of the positions it holds (as many)."""
        cache, ps = self.cache, self.cache.page_size
        tokens = self._tokens(f"{_WHO}.insert", tokens)
        table = cache._tables[cache._seq(seq)]
        if len(tokens) != cache.length(seq):
            raise ArgumentError(f"{_WHO}.insert: tokens must name the {cache.length(seq)} positions sequence {seq} "
                                f"holds; got {len(tokens)}")
        before = -1
        for i in range(len(tokens) // ps):
            key = (before, tuple(tokens[i * ps:(i + 1) * ps]))
            page = self._index.get(key)
            if page is None:
                page = table[i]
                if page in self._key:  # indexed under another prefix: cannot be (a page holds one content)
                    break
                self._index[key], self._key[page] = page, key
                cache._refs[page] += 1
                self._children[page] = 0
                if before >= 0:
                    self._children[before] += 1
                self.pages_indexed += 1
            self._lru[page] = None
            self._lru.move_to_end(page)
            before = page

    def match(self, tokens) -> tuple[int, int]:
        """A new sequence holding the longest indexed whole-page prefix of ``tokens``, on the indexed pages
        (shared); returns ``(sequence id, positions it holds)``: compute and append only ``tokens[positions:]``."""
        cache, ps = self.cache, self.cache.page_size
        tokens = self._tokens(f"{_WHO}.match", tokens)
        seq, before, table = cache.allocate(), -1, []
        for i in range(len(tokens) // ps):
            page = self._index.get((before, tuple(tokens[i * ps:(i + 1) * ps])))
            if page is None:
                break
            cache._refs[page] += 1
            self._lru.move_to_end(page)
            table.append(page)
            before = page
        cache._tables[seq], cache._lengths[seq] = table, len(table) * ps
        self.pages_reused += len(table)
        self.positions_reused += len(table) * ps
        return seq, len(table) * ps

    def evict(self, pages: int) -> int:
        """Free up to ``pages`` pages: the least recently used indexed pages no sequence holds and no indexed page
        continues (then their parents may go too). Returns the pages freed."""
        freed = 0
        while freed < pages:
            page = next((p for p in self._lru if self.cache._refs[p] == 1 and not self._children[p]), None)
            if page is None:
                break
            key = self._key.pop(page)
            del self._index[key], self._lru[page], self._children[page]
            if key[0] >= 0:
                self._children[key[0]] -= 1
            self.cache._release(page)
            self.pages_evicted += 1
            freed += 1
        return freed
