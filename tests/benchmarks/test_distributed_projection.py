"""benchmarks/distributed_projection.py: the alpha-beta model's limits hold."""

from __future__ import annotations

import math

from benchmarks import distributed_projection as model


def test_ring_is_never_faster_than_its_compute_and_hides_its_transfers_for_long_shards():
    for world in model.WORLDS:
        for length in model.LENGTHS:
            assert model.ring(length, world) >= model.compute_seconds(length, world) * (1 - 1e-12)
    assert math.isclose(model.ring(4 << 20, 8), model.compute_seconds(4 << 20, 8))


def test_ulysses_needs_world_dividing_the_heads_and_allgather_pays_its_transfer():
    assert math.isnan(model.ulysses(1 << 15, 64)) and not math.isnan(model.ulysses(1 << 15, 32))
    for world in model.WORLDS:
        assert model.allgather(1 << 20, world) > model.compute_seconds(1 << 20, world)


def test_table_has_one_row_per_world_and_length():
    rows = model.table()
    assert len(rows) == 2 + len(model.WORLDS) * len(model.LENGTHS)
    assert all(r.count("|") == 9 for r in rows)
