"""masks/cache.py: the bounded, thread-safe cache that masks carry (layouts, plans, biases, kernel masks)."""

from __future__ import annotations

import copy
import pickle
import threading

import torch

import attnkit
from attnkit import masks
from attnkit.masks.cache import BoundedCache, nbytes, on
from attnkit.nn import LocalAttention


def test_least_recently_used_entries_go_first():
    c = BoundedCache(max_entries=3)
    for key in "abc":
        c.get_or_build(key, lambda key=key: key.upper())
    assert c.get_or_build("a", lambda: "rebuilt") == "A"  # a hit refreshes "a"
    c.get_or_build("d", lambda: "D")
    assert list(c) == ["c", "a", "d"]  # "b", least recently used, went


def test_bytes_bound_the_cache_and_an_oversized_entry_is_never_kept():
    c = BoundedCache(max_entries=100, max_bytes=4096)
    for i in range(10):
        c.get_or_build(i, lambda: torch.zeros(256))  # 1 KiB each
    assert len(c) == 4 and c.bytes_held == 4096
    big = c.get_or_build("big", lambda: torch.zeros(2048))
    assert big.numel() == 2048 and "big" not in list(c)
    assert nbytes({"a": (torch.zeros(2), [torch.zeros(3, dtype=torch.float64)])}) == 8 + 24


def test_two_threads_sharing_one_mask_see_consistent_answers():
    mask = masks.global_tokens([0]) | masks.sliding_window(8, 8)
    errors = []

    def work(seed):
        try:
            for length in range(120, 400, 9 + seed):
                q, k, v = (torch.randn(1, 2, length, 8, generator=torch.Generator().manual_seed(length))
                           for _ in range(3))
                got = attnkit.attention(q, k, v, mask=mask, backend="blocksparse")
                torch.testing.assert_close(got, attnkit.attention(q, k, v, mask=mask, backend="reference"))
        except Exception as err:
            errors.append(err)
    threads = [threading.Thread(target=work, args=(seed,)) for seed in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(mask._cache_block_plans) <= 8


def test_used_masks_and_modules_still_copy_and_pickle_and_their_copies_start_empty():
    mask = masks.causal() & masks.strided(16)
    q = torch.randn(1, 1, 300, 8)
    attnkit.explain(q, q, q, mask=mask)
    assert len(on(mask, "block_plans")) == 1
    for clone in (copy.deepcopy(mask), pickle.loads(pickle.dumps(mask))):
        assert len(on(clone, "block_plans")) == 0
        torch.testing.assert_close(clone.materialize(7, 7), mask.materialize(7, 7))
    layer = LocalAttention(16, 2, 3, causal=True)
    x = torch.randn(2, 300, 16)
    want = layer(x)
    torch.testing.assert_close(copy.deepcopy(layer)(x), want)
