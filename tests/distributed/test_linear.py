"""Linear and Performer attention across ranks (distributed/linear.py) against the module on one process.

Outputs on each shard, the gradient of the input shard and the parameter gradients summed over
ranks (what DDP would do) are compared in float64 with ``layer(x_full)`` on one process.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

import attnkit
from attnkit.distributed import count_bytes, shard
from attnkit.distributed.linear import feature_attention, sequence_parallel
from attnkit.nn import LinearAttention, PerformerAttention

from . import cases, spawn

LAYERS = {"linear_causal": lambda: LinearAttention(12, 3, causal=True, chunk_size=4),
          "linear": lambda: LinearAttention(12, 3, chunk_size=4),
          "performer_causal": lambda: PerformerAttention(12, 3, causal=True, chunk_size=5, num_features=7),
          "performer": lambda: PerformerAttention(12, 3, num_features=7)}
LENGTH = 24


def _compare(name, layout, masked, group):
    torch.manual_seed(0)
    layer = LAYERS[name]().double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, LENGTH, 12, dtype=torch.float64, generator=g) * 2
    w = torch.randn(2, LENGTH, 12, dtype=torch.float64, generator=g)
    keep = torch.arange(LENGTH)[None, :] < torch.tensor([[LENGTH - 3], [9]]) if masked else None
    full = x.clone().requires_grad_()
    (layer(full, key_keep_mask=keep) * w).sum().backward()
    want_params = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    cut = lambda t, dim=1: shard(t, dim=dim, layout=layout, group=group)
    local = cut(x).requires_grad_()
    with count_bytes() as tally:
        out = sequence_parallel(layer, local, key_keep_mask=None if keep is None else cut(keep), layout=layout,
                                group=group)
    (out * cut(w)).sum().backward()
    got_params = [p.grad.clone() for p in layer.parameters()]
    for p in got_params:
        dist.all_reduce(p, group=group)
    return {"out": (out - cut(layer(x, key_keep_mask=keep).detach())).abs().max().item(),
            "dx": (local.grad - cut(full.grad)).abs().max().item(),
            "params": max((a - b).abs().max().item() for a, b in zip(got_params, want_params, strict=True)),
            "bytes": tally.by_kind.get("all_gather", 0)}


def _empty(name, layout):
    """A sequence of length 0 on every rank: the output's shape and the gradient of the input."""
    layer = LAYERS[name]().double()
    x = torch.zeros(2, 0, 12, dtype=torch.float64, requires_grad=True)
    out = sequence_parallel(layer, x, layout=layout)
    out.sum().backward()
    phi = torch.zeros(2, 3, 0, 4, dtype=torch.float64)
    return tuple(out.shape), tuple(x.grad.shape), tuple(feature_attention(phi, phi, phi, layout=layout).shape)


def _run(rank, world):
    groups = {4: None, 3: dist.new_group([1, 2, 3])}
    found = {}
    for name, layout in itertools.product(LAYERS, ("contiguous", "zigzag")):
        found["padding", name, layout] = cases.padding_is_inert(
            LAYERS[name], lambda m, x, keep, lay=layout: sequence_parallel(m, x, key_keep_mask=keep, layout=lay),
            layout=layout, padded=7)
        found["empty", name, layout] = _empty(name, layout)
    for w, group in groups.items():
        if group is None or rank in (1, 2, 3):
            for name, layout, masked in itertools.product(LAYERS, ("contiguous", "zigzag"), (False, True)):
                found[w, name, layout, masked] = _compare(name, layout, masked, group)
    try:
        sequence_parallel(torch.nn.Linear(2, 2), torch.randn(1, 2, 2))
    except attnkit.AttnkitError as e:
        found["error"] = str(e)
    return found


@pytest.fixture(scope="module")
def results():
    return spawn.run(_run, 4)


@pytest.mark.parametrize("world", [4, 3])
@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("masked", [False, True])
def test_matches_the_module_on_one_process(results, world, name, layout, masked):
    ranks = range(4) if world == 4 else (1, 2, 3)
    for rank in ranks:
        found = results[rank][world, name, layout, masked]
        assert max(found["out"], found["dx"], found["params"]) <= 1e-12, found
        pieces = 1 if layout == "contiguous" else 2
        heads, features = 3, (4 if name.startswith("linear") else 7)
        assert found["bytes"] == (world - 1) * pieces * 2 * heads * features * (4 + 1) * 8  # the states only


def test_other_modules_are_refused(results):
    assert "LinearAttention or PerformerAttention" in results[0]["error"]


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_non_finite_padding_reaches_no_output_and_no_gradient(results, name, layout):
    """The padding promise of the one-process modules (tests/nn/test_padding.py), across ranks."""
    for rank in range(4):
        for fill, (finite, diff) in results[rank]["padding", name, layout].items():
            assert finite and diff == 0.0, (rank, fill, finite, diff)


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_a_sequence_of_length_zero_gives_an_empty_output(results, name, layout):
    for rank in range(4):
        assert results[rank]["empty", name, layout] == ((2, 0, 12), (2, 0, 12), (2, 3, 0, 4))
