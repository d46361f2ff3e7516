"""Linear recurrences (decays, gates, the delta rule) and the layers built on them across ranks, against one process.

Each rank builds the same float64 inputs, computes the one-process answer (outputs, final state and
gradients of a loss on both), runs distributed/decay_linear.py on its shard with the same loss
restricted to it (the final-state term on rank 0 only) and reports the largest differences; the
parent asserts them (1e-12), with parameter and initial-state gradients summed over ranks.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from attnkit.distributed import count_bytes, recurrence, shard
from attnkit.distributed.decay_linear import sequence_parallel
from attnkit.errors import DTypeError
from attnkit.functional.linear.forms import linear_recurrence
from tests.nn.recurrent_layers import LAYERS

from . import spawn

B, H, L, DK, DV, DIM = 2, 3, 24, 5, 7, 12  # DIM: the layers'
RECURRENCES = {"decay_per_head": (False, False), "decay_per_channel": (True, False),
               "delta_per_head": (False, True), "delta_per_channel": (True, True)}


def _diff(a, b):
    return (a - b).abs().max().item()


def _summed(t):
    t = t.clone()
    dist.all_reduce(t)
    return t


def _compare_recurrence(name, layout, initial, rank, group):
    channel, delta = RECURRENCES[name]
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    full = [r(B, H, L, DK), r(B, H, L, DK), r(B, H, L, DV), F.logsigmoid(r(B, H, L, DK if channel else 1))]
    full.append(torch.sigmoid(r(B, H, L)) if delta else None)
    s0 = r(B, H, DK, DV).requires_grad_() if initial else None
    w_out, w_state = r(B, H, L, DV), r(B, H, DK, DV)
    leaves = [t.clone().requires_grad_() for t in full if t is not None]
    q, k, v, gates, *beta = leaves
    out, state = linear_recurrence("test", q, k, v, gates, beta[0] if beta else None, scale=None, normalize_qk=delta,
                                   form="chunk", chunk_size=3, initial_state=s0, cu_seqlens=None)
    want = torch.autograd.grad((out * w_out).sum() + (state * w_state).sum(), leaves + ([s0] if initial else []))
    cut = lambda t: shard(t, dim=2, layout=layout, group=group)
    local = [cut(t).detach().requires_grad_() for t in leaves]
    q, k, v, gates, *beta = local
    with count_bytes() as tally:
        got_out, got_state = recurrence(q, k, v, gates, beta[0] if beta else None, normalize_qk=delta,
                                        initial_state=s0, chunk_size=4, layout=layout, group=group)
    loss = (got_out * cut(w_out)).sum() + ((got_state * w_state).sum() if rank == 0 else 0)
    grads = torch.autograd.grad(loss, local + ([s0] if initial else []))
    found = {"out": _diff(got_out, cut(out)), "state": _diff(got_state, state),
             "grads": max(_diff(a, cut(b)) for a, b in zip(grads[: len(local)], want, strict=False)),
             "bytes": tally.by_kind.get("all_gather", 0)}
    if initial:
        found["initial"] = _diff(_summed(grads[-1]), want[-1])
    return found


def _compare_layer(name, layout, masked, rank, group):
    torch.manual_seed(0)
    layer = LAYERS[name](2).double()
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(B, L, DIM, generator=g, dtype=torch.float64), torch.randn(B, L, DIM, generator=g,
                                                                               dtype=torch.float64)
    keep = (torch.arange(L)[None] >= torch.tensor([[0], [5]])) if masked else None  # left padding in sample 1
    full = x.clone().requires_grad_()
    (layer(full, key_keep_mask=keep) * w).sum().backward()
    want = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    cut = lambda t: shard(t, dim=1, layout=layout, group=group)
    local = cut(x).requires_grad_()
    out = sequence_parallel(layer, local, key_keep_mask=None if keep is None else cut(keep), layout=layout,
                            group=group)
    (out * cut(w)).sum().backward()
    return {"out": _diff(out, cut(layer(x, key_keep_mask=keep).detach())), "dx": _diff(local.grad, cut(full.grad)),
            "params": max(_diff(_summed(p.grad), q) for p, q in zip(layer.parameters(), want, strict=True))}


def _run(rank, world):
    found = {}
    for name, layout, initial in itertools.product(RECURRENCES, ("contiguous", "zigzag"), (False, True)):
        found["recurrence", name, layout, initial] = _compare_recurrence(name, layout, initial, rank, None)
    for name, layout, masked in itertools.product(LAYERS, ("contiguous", "zigzag"), (False, True)):
        found["layer", name, layout, masked] = _compare_layer(name, layout, masked, rank, None)
    return found


@pytest.fixture(scope="module")
def results():
    return spawn.run(_run, 4)


@pytest.mark.parametrize("name", RECURRENCES)
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("initial", [False, True])
def test_the_recurrence_across_four_ranks_equals_one_process(results, name, layout, initial):
    _, delta = RECURRENCES[name]
    for rank in range(4):
        found = results[rank]["recurrence", name, layout, initial]
        assert max(v for key, v in found.items() if key != "bytes") <= 1e-12, found
        pieces = 1 if layout == "contiguous" else 2
        assert found["bytes"] == 3 * pieces * B * H * DK * ((DK if delta else 1) + DV) * 8  # the maps only


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("masked", [False, True])
def test_every_layer_across_four_ranks_equals_one_process(results, name, layout, masked):
    for rank in range(4):
        found = results[rank]["layer", name, layout, masked]
        assert max(found.values()) <= 1e-12, found


def test_other_modules_are_refused():  # before any collective: no process group needed
    with pytest.raises(DTypeError, match="sequence_parallel takes a linear-recurrent layer"):
        sequence_parallel(torch.nn.Linear(2, 2), torch.randn(1, 2, 2))
