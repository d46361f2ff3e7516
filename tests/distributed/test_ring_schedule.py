"""The ring's schedule (distributed/ring_schedule.py): the shortest way of every block to the ranks that need it."""

from __future__ import annotations

import torch

from attnkit.distributed.ring_schedule import rank_needs, split_hops


def test_split_hops_takes_the_shortest_way_to_every_rank_that_needs_a_block():
    w = 5
    everyone = [[True] * w for _ in range(w)]
    assert split_hops(everyone, w) == ([4] * w, [0] * w)  # the plain ring
    neighbours = [[abs(dst - src) <= 1 for src in range(w)] for dst in range(w)]
    assert split_hops(neighbours, w) == ([1, 1, 1, 1, 0], [0, 1, 1, 1, 1])
    nobody = [[dst == src for src in range(w)] for dst in range(w)]
    assert split_hops(nobody, w) == ([0] * w, [0] * w)


def _fewest_hops_by_search(needs, world):
    """Every split of every block tried in turn: the reference for split_hops."""
    forward, backward = [], []
    for src in range(world):
        best = None
        for split in range(world - 1, -1, -1):  # most forward first: the first of equal cost is kept
            f = max((t for t in range(1, split + 1) if needs[(src + t) % world][src]), default=0)
            b = max((world - t for t in range(split + 1, world) if needs[(src + t) % world][src]), default=0)
            if best is None or f + b < sum(best):
                best = (f, b)
        forward.append(best[0])
        backward.append(best[1])
    return forward, backward


def test_split_hops_equals_a_search_over_every_split():
    g = torch.Generator().manual_seed(0)
    for world in (1, 2, 3, 4, 5, 7, 9):
        for density in (0.1, 0.3, 0.6, 0.9):
            needs = (torch.rand(world, world, generator=g) < density).tolist()
            assert split_hops(needs, world) == _fewest_hops_by_search(needs, world), (world, needs)


def test_rank_needs_reads_the_chunk_map_rank_by_rank():
    causal = torch.ones(8, 8, dtype=torch.bool).tril()  # 2W = 8 chunks, W = 4
    assert rank_needs(causal, "zigzag", 4).all()  # every zigzag rank holds a late chunk
    contiguous = torch.ones(4, 4, dtype=torch.bool).tril()
    assert torch.equal(rank_needs(contiguous, "contiguous", 4), contiguous)
    diagonal = torch.eye(8, dtype=torch.bool)
    assert torch.equal(rank_needs(diagonal, "zigzag", 4), torch.eye(4, dtype=torch.bool))
