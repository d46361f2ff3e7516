"""One bounded, thread-safe cache for what masks and kernels derive from a mask and sizes.

Masks are immutable and often long-lived (one padding mask serves every layer; a
``causal() & sliding_window(w)`` object serves every length a generation loop
reaches), so what is derived from them (block layouts, block plans, slab biases,
SDPA masks) is worth keeping, but not forever: a mask reused over thousands of
lengths must not grow memory without bound. :class:`BoundedCache` keeps the most
recently used entries within a count and a byte budget (LRU), and takes a lock so
two threads may share one mask.

:func:`on` finds (or creates) the cache called ``name`` on an object, so every
user writes ``on(mask, "layouts").get_or_build(key, build)`` and nothing else.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable

import torch

__all__ = ["BoundedCache", "on", "nbytes"]

_CREATE = threading.Lock()  # guards creating a cache on an object, not its use


def nbytes(value) -> int:
    """Bytes held by the tensors in ``value`` (a tensor, or nested tuples/lists/dicts/NamedTuples of them)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(nbytes(v) for v in value.values())
    if isinstance(value, (tuple, list)):
        return sum(nbytes(v) for v in value)
    return 0


class BoundedCache:
    """A least-recently-used map bounded by entry count and by the bytes of its tensors.

    An entry larger than ``max_bytes`` by itself is built and returned but never kept.

    Example:
        >>> c = BoundedCache(max_entries=2)
        >>> [c.get_or_build(n, lambda n=n: n * n) for n in (1, 2, 3, 1)]
        [1, 4, 9, 1]
        >>> sorted(c.keys())
        [1, 3]
    """

    def __init__(self, max_entries: int = 16, max_bytes: int = 1 << 26):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._items: OrderedDict = OrderedDict()
        self._sizes: dict = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def get_or_build(self, key: Hashable, build: Callable[[], object]):
        """The value for ``key``, built by ``build()`` on a miss (outside the lock: builds may be slow)."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        value = build()
        size = nbytes(value)
        if size > self.max_bytes:
            return value
        with self._lock:
            if key not in self._items:
                self._items[key], self._sizes[key] = value, size
                self._bytes += size
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries or self._bytes > self.max_bytes:
                old, _ = self._items.popitem(last=False)
                self._bytes -= self._sizes.pop(old)
            return self._items.get(key, value)

    def __reduce__(self):
        """Copies and pickles (of a mask, of a module holding one) start empty: caches are not state."""
        return type(self), (self.max_entries, self.max_bytes)

    def keys(self) -> list:
        with self._lock:
            return list(self._items)

    def __iter__(self):
        return iter(self.keys())

    @property
    def bytes_held(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)


def on(owner, name: str, max_entries: int = 16, max_bytes: int = 1 << 26) -> BoundedCache:
    """The :class:`BoundedCache` called ``name`` kept on ``owner`` (created on first use)."""
    attr = f"_cache_{name}"
    cache = owner.__dict__.get(attr)
    if cache is None:
        with _CREATE:
            cache = owner.__dict__.setdefault(attr, BoundedCache(max_entries, max_bytes))
    return cache
