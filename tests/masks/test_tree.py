"""Draft trees verified in one call: each node's output is its root-to-node path's alone (float64, 1e-12)."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.nn import KVCache, PagedKVCache
from tests.oracle import dense_attention


def _random_tree(nodes: int, g: torch.Generator) -> list[int]:
    """Each node's parent drawn among the earlier nodes or -1 (a root)."""
    return [int(torch.randint(-1, i, (), generator=g)) if i else -1 for i in range(nodes)]


def _path(parents, node):
    out = [node]
    while parents[out[-1]] >= 0:
        out.append(parents[out[-1]])
    return out[::-1]


def _alone(q, k, v, cached, parents, node, sinks=None):
    """Node ``node`` attending the committed keys and its path, as plain causal decoding of the path would."""
    keep = list(range(cached)) + [cached + a for a in _path(parents, node)]
    out = dense_attention(q[:, :, node:node + 1], k[:, :, keep], v[:, :, keep], mask=masks.causal(), sinks=sinks)
    return out[:, :, 0]


@pytest.mark.parametrize("nodes,seed", [(1, 0), (7, 1), (23, 2), (64, 3)])
def test_every_node_equals_its_path_alone(nodes, seed):
    """Grouped queries (4 heads over 2) and sinks, 20 committed keys, float64."""
    g = torch.Generator().manual_seed(seed)
    parents = _random_tree(nodes, g)
    q = torch.randn(2, 4, nodes, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 20 + nodes, 8, generator=g, dtype=torch.float64) for _ in range(2))
    sinks = torch.randn(4, generator=g, dtype=torch.float64)
    out = attnkit.attention(q, k, v, mask=masks.tree(parents), sinks=sinks)
    for node in range(nodes):
        torch.testing.assert_close(out[:, :, node], _alone(q, k, v, 20, parents, node, sinks), rtol=0, atol=1e-12)


def test_a_chain_is_causal_and_earlier_rows_are_causal():
    chain = masks.tree([-1, 0, 1, 2])
    assert chain.materialize(4, 9).equal(masks.causal().materialize(4, 9))
    assert masks.tree([-1, -1]).materialize(4, 6)[0, 0, :2].equal(masks.causal().materialize(4, 6)[0, 0, :2])


def test_per_sequence_trees_on_the_paged_path_equal_each_path_alone():
    """Batched: one tree per sequence (B, T), sequences of different lengths on shared pool pages."""
    g = torch.Generator().manual_seed(5)
    trees = [_random_tree(6, g), _random_tree(6, g)]
    cache = PagedKVCache(16, 4, 2, 8, dtype=torch.float64)
    seqs, stored = [], []
    for cached in (9, 14):
        seq = cache.allocate()
        k, v = (torch.randn(2, cached + 6, 8, generator=g, dtype=torch.float64) for _ in range(2))
        cache.append(seq, k, v)
        seqs.append(seq)
        stored.append((k, v, cached))
    q = torch.randn(2, 4, 6, 8, generator=g, dtype=torch.float64)
    tree = masks.tree(trees)
    out = cache.attend(seqs, q, mask=tree)
    assert attnkit.explain(q, cache.k_pages, cache.v_pages, block_table=cache.block_table(seqs),
                           seqused_k=cache.lengths(seqs), mask=tree).path == "paged-split-kv"
    for b, (k, v, cached) in enumerate(stored):
        for node in range(6):
            want = _alone(q[b:b + 1], k[None], v[None], cached, trees[b], node)
            torch.testing.assert_close(out[b:b + 1, :, node], want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kv_format", [None, "int8"])
def test_committing_a_path_leaves_the_cache_of_a_plain_decode_of_it(kv_format):
    g = torch.Generator().manual_seed(6)
    parents = [-1, 0, 0, 1, 2, 4]
    k, v = (torch.randn(2, 2, 5 + 6, 8, generator=g) for _ in range(2))
    verified, plain = (KVCache(2, 16, 2, 8, kv_format=kv_format) for _ in range(2))
    verified.append(k, v)
    path = [0, 2, 4, 5]
    verified.commit(masks.tree(parents), path)
    keep = list(range(5)) + [5 + a for a in path]
    plain.append(k[:, :, keep], v[:, :, keep])
    assert len(verified) == len(plain) == 9
    assert verified._k.view(torch.uint8).equal(plain._k.view(torch.uint8))  # the whole buffers, tails zeroed
    assert verified._v.view(torch.uint8).equal(plain._v.view(torch.uint8))
    for name, scale in plain.scales.items():
        assert verified.scales[name].equal(scale)


def test_per_row_paths_commit_each_row_its_own():
    g = torch.Generator().manual_seed(7)
    k, v = (torch.randn(2, 1, 4, 3, generator=g) for _ in range(2))
    cache = KVCache(2, 8, 1, 3)
    cache.append(k, v)
    cache.commit(masks.tree([[-1, 0, 0, 1], [-1, -1, 1, 2]]), [[0, 1], [1, 2]])
    assert cache.keys[0].equal(k[0, :, [0, 1]]) and cache.keys[1].equal(k[1, :, [1, 2]])


def test_bad_trees_and_commits_name_the_argument():
    with pytest.raises(ArgumentError, match=r"every parent must precede its node .* got parents\[2\] = 2"):
        masks.tree([-1, 0, 2])
    with pytest.raises(ArgumentError, match=r"parents\[0\] = -2"):
        masks.tree([-2])
    with pytest.raises(DTypeError, match="integer node indices"):
        masks.tree(torch.tensor([-1.0, 0.0]))
    with pytest.raises(ShapeError, match="parents must have shape"):
        masks.tree(torch.zeros(1, 1, 1, dtype=torch.long))
    cache = KVCache(1, 8, 1, 2)
    cache.append(torch.randn(1, 1, 5, 2), torch.randn(1, 1, 5, 2))
    tree = masks.tree([-1, 0, 0])
    with pytest.raises(ArgumentError, match=r"root-to-node path .* got \[1, 2\], the path to node 2 is \[0, 2\]"):
        cache.commit(tree, [1, 2])
    with pytest.raises(ArgumentError, match="length must be at most the 5 stored positions"):
        cache.truncate(6)
    with pytest.raises(DTypeError, match="tree must be"):
        cache.commit(masks.causal(), [0])
    with pytest.raises(ShapeError, match="tree's 9 nodes"):
        cache.commit(masks.tree(list(range(-1, 8))), [0])


@pytest.mark.parametrize("kv_format", [None, "float8_e4m3"])
def test_a_paged_commit_leaves_what_a_plain_decode_of_the_path_stores(kv_format):
    """The tree verified on a forked sequence (its pages shared with the parent until written)."""
    g = torch.Generator().manual_seed(8)
    parents, path = [-1, 0, 1, 0, 3, 4, 4], [0, 3, 4, 6]
    k, v = (torch.randn(2, 6 + 7, 8, generator=g) for _ in range(2))
    cache = PagedKVCache(12, 4, 2, 8, kv_format=kv_format)
    parent = cache.allocate()
    cache.append(parent, k[:, :6], v[:, :6])
    seq = cache.fork(parent)
    cache.append(seq, k[:, 6:], v[:, 6:])
    cache.commit(seq, masks.tree(parents), path)
    plain = PagedKVCache(12, 4, 2, 8, kv_format=kv_format)
    other = plain.allocate()
    keep = list(range(6)) + [6 + a for a in path]
    plain.append(other, k[:, keep], v[:, keep])

    def rows(c, s):
        pos = torch.arange(c.length(s))
        table = c.block_table([s])[0]
        return [t[table[pos // 4], pos % 4].view(torch.uint8) if t.element_size() == 1 else t[table[pos // 4], pos % 4]
                for t in c._stored()]

    assert cache.length(seq) == 10 and cache.length(parent) == 6
    for got, want in zip(rows(cache, seq), rows(plain, other), strict=True):
        assert got.equal(want)
    assert all(t.equal(w) for t, w in zip(rows(cache, parent), [r[:6] for r in rows(plain, other)], strict=True))
    cache.truncate(seq, 2)
    assert cache.length(seq) == 2 and cache.pages_free == 12 - 2  # the parent's two pages, shared again by seq
