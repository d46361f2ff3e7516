"""PagedKVCache: pages, page tables, forks with copy on write, frees; attention through the table."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.nn import KVCache, PagedKVCache


def _stored(cache, seq):
    """The sequence's keys and values read back through its pages, (Hkv, n, D)."""
    table = cache.block_table([seq])[0]
    n = cache.length(seq)
    k = cache.k_pages[table].flatten(0, 1)[:n].transpose(0, 1)
    v = cache.v_pages[table].flatten(0, 1)[:n].transpose(0, 1)
    return k, v


def test_append_stores_positions_exactly_across_pages():
    cache = PagedKVCache(9, 4, 3, 5, v_head_dim=7)
    seq = cache.allocate()
    k, v = torch.randn(3, 6, 5), torch.randn(3, 6, 7)
    cache.append(seq, k[:, :3], v[:, :3])
    cache.append(seq, k[:, 3:], v[:, 3:])
    got_k, got_v = _stored(cache, seq)
    assert torch.equal(got_k, k) and torch.equal(got_v, v)
    assert cache.length(seq) == 6 and cache.pages_free == 7


def test_a_fork_shares_pages_until_it_writes_into_one():
    cache = PagedKVCache(8, 4, 2, 3)
    parent = cache.allocate()
    prefix = torch.randn(2, 6, 3)
    cache.append(parent, prefix, prefix)
    child = cache.fork(parent)
    assert cache.block_table([parent]).tolist() == cache.block_table([child]).tolist() and cache.pages_free == 6
    cache.append(child, torch.ones(2, 1, 3), torch.ones(2, 1, 3))  # the half-filled shared page is copied
    assert cache.block_table([child])[0, 0] == cache.block_table([parent])[0, 0]  # the full page stays shared
    assert cache.block_table([child])[0, 1] != cache.block_table([parent])[0, 1] and cache.pages_free == 5
    assert torch.equal(_stored(cache, parent)[0], prefix)
    assert torch.equal(_stored(cache, child)[0], torch.cat([prefix, torch.ones(2, 1, 3)], 1))
    cache.free(parent)
    assert cache.pages_free == 6  # the parent's own copy of page 2 returns; the shared first page does not
    cache.free(child)
    assert cache.pages_free == 8 and len(cache) == 0


def test_decoding_over_pages_equals_a_contiguous_cache():
    torch.manual_seed(0)
    paged, contiguous = PagedKVCache(40, 8, 2, 16), KVCache(2, 100, 2, 16)
    seqs = [paged.allocate(), paged.allocate()]
    for step, t in enumerate((17, 1, 1, 5)):
        k, v = torch.randn(2, 2, t, 16), torch.randn(2, 2, t, 16)
        for b, seq in enumerate(seqs):
            paged.append(seq, k[b], v[b])
        keys, values = contiguous.append(k, v)
        q = torch.randn(2, 6, t, 16)
        got = paged.attend(seqs, q)
        torch.testing.assert_close(got, attnkit.attention(q, keys, values, mask=masks.causal()), rtol=0, atol=2e-6)
        room_k, room_v = contiguous._k, contiguous._v  # the whole buffer, its lengths given: bit for bit
        assert torch.equal(got, attnkit.attention(q, room_k, room_v, seqused_k=paged.lengths(seqs),
                                                  mask=masks.causal())), step


def test_errors_name_the_argument():
    cache = PagedKVCache(2, 4, 2, 3)
    seq = cache.allocate()
    with pytest.raises(ShapeError, match=r"out of pages: sequence 0 needs 3 more pages for length 9, 2 of 2"):
        cache.append(seq, torch.zeros(2, 9, 3), torch.zeros(2, 9, 3))
    with pytest.raises(ShapeError, match=r"k must have shape \(kv_heads=2, new_len, 3\)"):
        cache.append(seq, torch.zeros(3, 1, 3), torch.zeros(3, 1, 3))
    with pytest.raises(DTypeError, match=r"k must have the cache dtype torch\.float32"):
        cache.append(seq, torch.zeros(2, 1, 3, dtype=torch.float64), torch.zeros(2, 1, 3))
    with pytest.raises(ArgumentError, match="no sequence 7"):
        cache.fork(7)
    with pytest.raises(ArgumentError, match="page_size must be an int >= 1"):
        PagedKVCache(2, 0, 2, 3)


def test_explain_names_the_paged_path():
    cache = PagedKVCache(6, 4, 1, 8)
    seq = cache.allocate()
    cache.append(seq, torch.randn(1, 10, 8), torch.randn(1, 10, 8))
    d = attnkit.explain(torch.randn(1, 2, 1, 8), cache.k_pages, cache.v_pages, block_table=cache.block_table([seq]),
                        seqused_k=cache.lengths([seq]), mask=masks.causal())
    assert d.path == "paged-split-kv"


def test_a_quantized_fork_copies_the_shared_page_with_its_scales():
    """Copy on write carries the page's per (token, head) scales; codes and scales as quantizing the sequence."""
    from attnkit.functional.quantize import KVFormat

    fmt = KVFormat("int8")
    cache = PagedKVCache(6, 4, 2, 8, kv_format=fmt)
    parent = cache.allocate()
    k, v = torch.randn(2, 6, 8), torch.randn(2, 6, 8)
    cache.append(parent, k, v)
    child = cache.fork(parent)
    extra = torch.randn(2, 1, 8)
    cache.append(child, extra, extra)
    assert cache.pages_free == 3  # the parent's two pages, and the copy of the shared second page
    for seq, keys in ((parent, k), (child, torch.cat([k, extra], 1))):
        table, n = cache.block_table([seq])[0], cache.length(seq)
        pos = torch.arange(n)
        codes = cache.k_pages[table[pos // 4], pos % 4].transpose(0, 1)
        scales = cache.k_scales[table[pos // 4], pos % 4].transpose(0, 1)
        want_codes, want_scales = fmt.quantize(keys)
        assert codes.equal(want_codes) and scales.equal(want_scales)
    assert cache.bytes_per_token == 2 * 2 * 8 + 2 * 2 * 4
    assert "kv_format=int8" in repr(cache)


def test_forks_of_one_prompt_attend_through_the_cascade_reading_the_shared_pages_once():
    """Four forks of a 13-position prompt (pages of 4: three whole shared pages), each with its own continuation:
    attend takes the cascade (explain shows the shared prefix read once) and equals the ordinary paged call and a
    dense float64 softmax, with and without sinks."""
    g = torch.Generator().manual_seed(0)
    cache = PagedKVCache(40, 4, 2, 6, dtype=torch.float64)
    root = cache.allocate()
    cache.append(root, torch.randn(2, 13, 6, generator=g, dtype=torch.float64),
                 torch.randn(2, 13, 6, generator=g, dtype=torch.float64))
    seqs = [cache.fork(root) for _ in range(3)] + [root]
    for i, s in enumerate(seqs):
        cache.append(s, torch.randn(2, 2 + i, 6, generator=g, dtype=torch.float64),
                     torch.randn(2, 2 + i, 6, generator=g, dtype=torch.float64))
    q = torch.randn(4, 4, 2, 6, generator=g, dtype=torch.float64)
    plan = cache.explain(seqs, q)
    assert (plan.prefix_from, plan.prefix_len, plan.stacked_rows) == (0, 12, 8)
    assert "read once for 8 stacked query rows of 4 requests" in str(plan)
    assert cache.explain(seqs, q, cascade=False).path == "paged-split-kv"
    for sinks in (None, torch.randn(4, generator=g, dtype=torch.float64)):
        extra = {} if sinks is None else {"sinks": sinks}
        out = cache.attend(seqs, q, **extra)
        torch.testing.assert_close(out, cache.attend(seqs, q, cascade=False, **extra), rtol=0, atol=1e-12)
        for row, s in enumerate(seqs):
            table, n = cache.block_table([s])[0], int(cache.lengths([s]))
            k = cache.k_pages[table].flatten(0, 1)[:n].transpose(0, 1).repeat_interleave(2, 0)  # (H, n, D)
            v = cache.v_pages[table].flatten(0, 1)[:n].transpose(0, 1).repeat_interleave(2, 0)
            scores = (q[row] @ k.transpose(-1, -2)) / 6 ** 0.5
            scores = scores.masked_fill(torch.arange(n)[None, :] > torch.arange(n - 2, n)[:, None], float("-inf"))
            if sinks is not None:
                scores = torch.cat([scores, sinks[:, None, None].expand(4, 2, 1)], -1)
            torch.testing.assert_close(out[row], scores.softmax(-1)[..., :n] @ v, rtol=0, atol=1e-12)


def test_sequences_growing_in_turn_keep_consecutive_pages_while_the_pool_allows():
    # each sequence's next page follows its last; a new sequence starts halfway into the largest free run (at the
    # pool's start when the run starts it), so four sequences appended a page at a time share 16 pages in 4 runs
    cache = PagedKVCache(16, 2, 1, 3)
    seqs = [cache.allocate() for _ in range(4)]
    for _ in range(4):
        for seq in seqs:
            cache.append(seq, torch.randn(1, 2, 3), torch.randn(1, 2, 3))
    table = cache.block_table(seqs)
    assert (table.diff(dim=1) == 1).all() and sorted(table[:, 0].tolist()) == [0, 4, 8, 12]
    cache.free(seqs[1])
    late = cache.allocate()  # the freed run, from its middle: two consecutive pages
    cache.append(late, torch.randn(1, 4, 3), torch.randn(1, 4, 3))
    assert cache.block_table([late])[0].tolist() == [table[1, 0] + 2, table[1, 0] + 3]
    for seq in (seqs[0], late):  # the page after their last, or any free page: none lost or shared
        cache.append(seq, torch.randn(1, 2, 3), torch.randn(1, 2, 3))
    held = cache.block_table([seqs[0], late, seqs[2], seqs[3]])
    lengths = cache.lengths([seqs[0], late, seqs[2], seqs[3]]).tolist()
    used = [p for row, n in zip(held.tolist(), lengths, strict=True) for p in row[:n // 2]]
    assert len(used) == len(set(used)) == 16 and cache.pages_free == 0
