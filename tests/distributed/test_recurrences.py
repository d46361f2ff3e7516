"""Linear recurrences (decays, gates, the delta rule) and the layers built on them across ranks, against one process.

Each rank builds the same float64 inputs, computes the one-process answer (outputs, final state and
gradients of a loss on both), runs distributed/recurrences.py on its shard with the same loss
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
from attnkit.distributed.recurrences import sequence_parallel
from attnkit.errors import AttnkitError, DTypeError
from attnkit.functional.recurrences.forms import linear_recurrence
from tests.nn.recurrent_layers import LAYERS as ALL_LAYERS
from tests.nn.recurrent_layers import OWN_RECURRENCE

from . import spawn

# DeltaProduct's several steps a token, RWKV-4's one-token-late sums and the recurrences of their own (Comba,
# RWKV-7) are refused across ranks (tests below).
LAYERS = {name: build for name, build in ALL_LAYERS.items()
          if not name.startswith("delta_product") and name not in ("rwkv4", *OWN_RECURRENCE)}

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


def _disagreements(rank):
    """Calls that differ on rank 2 (or fail its own checks there): the error every rank raises."""
    odd = rank == 2
    make = lambda n, d: torch.zeros(B, H, n, d, dtype=torch.float64)
    inputs = lambda n: (make(n, DK), make(n, DK), make(n, DV), make(n, 1))
    torch.manual_seed(0)
    layer = LAYERS["deltanet"](2).double()
    x = torch.zeros(B, 4, DIM, dtype=torch.float64)
    calls = {"length": lambda: recurrence(*inputs(4 if odd else 8)),
             "own_check": lambda: recurrence(*inputs(8), beta=torch.zeros(B, H, 7 if odd else 8, dtype=torch.float64)),
             "keep_mask": lambda: sequence_parallel(layer, x, key_keep_mask=torch.ones(B, 4, dtype=torch.bool) if odd
                                                    else None)}
    found = {}
    for name, call in calls.items():
        try:
            call()
            found[name] = ("no error", "")
        except AttnkitError as e:
            found[name] = (type(e).__name__, str(e))
    return found


def _empty(rank, group):
    """A global length of 0: empty outputs and gradients, the initial state as the final one."""
    leaves = [torch.randn(B, H, 0, d, dtype=torch.float64, requires_grad=True) for d in (DK, DK, DV, 1)]
    s0 = torch.randn(B, H, DK, DV, dtype=torch.float64)
    out, state = recurrence(*leaves, initial_state=s0, group=group)
    out.sum().backward()
    torch.manual_seed(0)
    layer = LAYERS["kda"](2).double()
    x = torch.randn(B, 0, DIM, dtype=torch.float64, requires_grad=True)
    y = sequence_parallel(layer, x, group=group)
    y.sum().backward()
    return {"shapes": (tuple(out.shape), tuple(y.shape), tuple(x.grad.shape)), "state": _diff(state, s0),
            "grads": [tuple(t.grad.shape) for t in leaves]}


def _run(rank, world):
    found = {"disagreements": _disagreements(rank), "empty": _empty(rank, None)}
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


@pytest.mark.parametrize(("name", "kind", "words"), [
    ("length", "ShapeError", "the shard length (q.shape[2]): 8 on ranks 0, 1, 3; 4 on rank 2"),
    ("own_check", "ArgumentError", "rank 2 refused the call"),
    ("keep_mask", "ArgumentError", "whether a key_keep_mask is given: 0 on ranks 0, 1, 3; 1 on rank 2")])
def test_ranks_that_disagree_all_raise_the_same_named_error(results, name, kind, words):
    for rank in range(4):
        got_kind, message = results[rank]["disagreements"][name]
        if name == "own_check" and rank == 2:  # its own error: beta's shape
            assert got_kind == "ShapeError" and "beta" in message, message
            continue
        assert got_kind == kind and words in message, (rank, message)


def test_a_global_length_of_zero_gives_empty_results_on_every_rank(results):
    for rank in range(4):
        found = results[rank]["empty"]
        assert found["shapes"] == ((B, H, 0, DV), (B, 0, DIM), (B, 0, DIM)) and found["state"] == 0
        assert found["grads"] == [(B, H, 0, DK), (B, H, 0, DK), (B, H, 0, DV), (B, H, 0, 1)]


def test_a_layer_of_several_steps_per_token_is_refused_before_any_collective():
    from attnkit.errors import UnsupportedFeature

    with pytest.raises(UnsupportedFeature, match="3 recurrence steps per token"):
        sequence_parallel(ALL_LAYERS["delta_product"](2), torch.randn(1, 4, 12))


def test_a_layer_whose_sums_are_read_one_token_late_is_refused_before_any_collective():
    from attnkit.errors import UnsupportedFeature

    with pytest.raises(UnsupportedFeature, match="predecessor's sums"):
        sequence_parallel(ALL_LAYERS["rwkv4"](2), torch.randn(1, 4, 12))
