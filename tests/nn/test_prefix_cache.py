"""PrefixCache: a new sequence starting like an indexed one reuses its pages (no recomputation) with equal outputs;
least recently used leaves are evicted when the pool runs out; writes into reused pages copy them first."""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.nn import PagedKVCache, PrefixCache

V, HKV, H, D, PS = 50, 2, 4, 6, 4


class _Toy:
    """Queries, keys and values looked up per token id (float64), counting the positions it computes."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.q, self.k, self.v = (torch.randn(V, n, D, generator=g, dtype=torch.float64) for n in (H, HKV, HKV))
        self.computed = 0

    def kv(self, tokens):
        self.computed += len(tokens)
        ids = torch.tensor(tokens)
        return self.k[ids].transpose(0, 1), self.v[ids].transpose(0, 1)  # (HKV, t, D)

    def query(self, token):
        return self.q[token][None, :, None]  # (1, H, 1, D)


def _serve(cache, toy, tokens, index=None):
    """Prefill ``tokens`` (after what the index already holds) and attend with the last token's query."""
    seq, cached = index.match(tokens) if index is not None else (cache.allocate(), 0)
    cache.append(seq, *toy.kv(tokens[cached:]))
    if index is not None:
        index.insert(seq, tokens)
    return seq, cached, cache.attend([seq], toy.query(tokens[-1]))


def test_a_prefix_hit_reuses_the_pages_computes_only_the_rest_and_equals_a_run_without_the_cache():
    toy, plain_toy = _Toy(), _Toy()
    cache, plain = PagedKVCache(32, PS, HKV, D, dtype=torch.float64), PagedKVCache(32, PS, HKV, D, dtype=torch.float64)
    index = PrefixCache(cache)
    system = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]  # two whole pages and two more tokens
    first, _, _ = _serve(cache, toy, system + [7, 7, 8], index)
    assert toy.computed == 13 and index.pages_indexed == 3
    second, cached, out = _serve(cache, toy, system + [11, 12, 13, 14, 15], index)
    assert cached == 8 and toy.computed == 13 + 7 and index.pages_reused == 2  # only the 7 new positions computed
    assert cache.block_table([second])[0, :2].tolist() == cache.block_table([first])[0, :2].tolist()
    _, _, want = _serve(plain, plain_toy, system + [11, 12, 13, 14, 15])
    assert plain_toy.computed == 15
    assert torch.equal(out, want)
    _, cached, _ = _serve(cache, toy, [3, 1, 4, 2] + [0] * 6, index)  # differs in the first page's last token
    assert cached == 0


def test_writing_into_a_reused_page_copies_it_and_the_indexed_content_stays():
    toy = _Toy()
    cache = PagedKVCache(16, PS, HKV, D, dtype=torch.float64)
    index = PrefixCache(cache)
    a, _, _ = _serve(cache, toy, list(range(8)), index)
    kept = cache.k_pages[cache.block_table([a])[0]].clone()
    b, cached = index.match(list(range(8)) + [9])
    assert cached == 8
    cache.truncate(b, 6)
    cache.append(b, *toy.kv([40, 41]))  # overwrites positions 6, 7 of b: its second page is copied first
    assert cache.block_table([b])[0, 1] != cache.block_table([a])[0, 1]
    assert torch.equal(cache.k_pages[cache.block_table([a])[0]], kept)
    c, cached = index.match(list(range(8)))
    assert cached == 8 and cache.block_table([c])[0].tolist() == cache.block_table([a])[0].tolist()


def test_the_least_recently_used_unheld_leaves_are_evicted_when_the_pool_runs_out():
    toy = _Toy()
    cache = PagedKVCache(6, PS, HKV, D, dtype=torch.float64)
    index = PrefixCache(cache)
    old, _, _ = _serve(cache, toy, [1] * 8, index)  # pages p0 <- p1
    new, _, _ = _serve(cache, toy, [2] * 8, index)  # pages q0 <- q1
    cache.free(old)
    cache.free(new)
    again, cached, _ = _serve(cache, toy, [2] * 8 + [3], index)  # touches q0, q1: now [1]'s pages are the oldest
    cache.free(again)
    assert cached == 8 and cache.pages_free == 2
    seq = cache.allocate()
    cache.append(seq, *toy.kv([5] * 12))  # 3 pages: one taken from the index, its leaf of [1] * 8 first
    assert index.pages_evicted == 1 and index.match([1] * 8)[1] == 4 and index.match([2] * 8)[1] == 8
    with pytest.raises(ShapeError, match="out of pages"):
        cache.append(seq, *toy.kv([5] * 20))


def test_bad_prefix_cache_input_gets_attnkits_errors():
    cache = PagedKVCache(4, PS, HKV, D)
    index = PrefixCache(cache)
    with pytest.raises(ArgumentError, match="already has a prefix cache"):
        PrefixCache(cache)
    with pytest.raises(DTypeError, match="must be a PagedKVCache"):
        PrefixCache(object())
    seq = cache.allocate()
    cache.append(seq, torch.zeros(HKV, 3, D), torch.zeros(HKV, 3, D))
    with pytest.raises(ArgumentError, match="must name the 3 positions sequence 0 holds; got 2"):
        index.insert(seq, [1, 2])
    with pytest.raises(DTypeError, match="1-D integer sequence"):
        index.match(torch.zeros(3))
