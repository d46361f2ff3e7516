"""shard and gather (distributed/layouts.py): positions per rank, round trips for any dtype, gather's gradient."""

from __future__ import annotations

import pytest
import torch

from attnkit.distributed import gather, layouts, shard

from . import spawn

WORLD = 3


def test_chunks_per_rank():
    assert [layouts.chunks_of("contiguous", r, 4) for r in range(4)] == [(0,), (1,), (2,), (3,)]
    assert [layouts.chunks_of("zigzag", r, 4) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    full = torch.arange(16)
    for layout in layouts.LAYOUTS:
        parts = layouts.split(full, 0, layout, 4)
        assert torch.equal(layouts.assemble(parts, 0, layout), full)
        assert sorted(torch.cat(parts).tolist()) == list(range(16))
    assert layouts.split(full, 0, "zigzag", 4)[1].tolist() == [2, 3, 12, 13]


def _round_trips(rank, world):
    g = torch.Generator().manual_seed(0)
    tensors = {"float64_dim2": (torch.randn(2, 3, 12, 5, dtype=torch.float64, generator=g), -2),
               "int64_dim0": (torch.arange(24).view(12, 2), 0), "bool_dim1": (torch.rand(2, 6, generator=g) < 0.5, 1),
               "bfloat16_last": (torch.randn(3, 12, generator=g).bfloat16(), -1)}
    found = {}
    for layout in layouts.LAYOUTS:
        for name, (x, dim) in tensors.items():
            part = shard(x, dim=dim, layout=layout)
            back = gather(part, dim=dim, layout=layout)
            found[layout, name] = (part.dtype == x.dtype, back.dtype == x.dtype, torch.equal(back, x),
                                   part.shape[dim] * world == x.shape[dim])
        # gather's gradient: every rank's loss weights the full tensor by (rank + 1) * w, so each shard's
        # gradient is the sum over ranks: (1 + ... + W) * its shard of w.
        x = torch.randn(2, 12, 3, dtype=torch.float64, generator=g)
        w = torch.randn(2, 12, 3, dtype=torch.float64, generator=g)
        part = shard(x, dim=1, layout=layout).requires_grad_()
        ((rank + 1) * gather(part, dim=1, layout=layout) * w).sum().backward()
        want = world * (world + 1) / 2 * shard(w, dim=1, layout=layout)
        found[layout, "grad"] = (part.grad - want).abs().max().item()
    return found


@pytest.fixture(scope="module")
def round_trips():
    return spawn.run(_round_trips, WORLD)


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
@pytest.mark.parametrize("name", ["float64_dim2", "int64_dim0", "bool_dim1", "bfloat16_last"])
def test_gather_of_shard_is_the_tensor(round_trips, layout, name):
    for found in round_trips:
        assert found[layout, name] == (True, True, True, True)


@pytest.mark.parametrize("layout", layouts.LAYOUTS)
def test_gather_gradient_is_the_sum_over_ranks(round_trips, layout):
    for found in round_trips:
        assert found[layout, "grad"] <= 1e-12
