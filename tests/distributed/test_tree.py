"""distributed/tree.py: a decoding step over a KV cache split across 4 gloo processes, against one process.

Every rank holds the step's queries (Lq = 3, the last positions of the sequence) and its shard
of the cache; the answer, the same on every rank, is compared in float64 with single-process
``attnkit.attention`` on the whole cache: output and lse within 1e-12, for both layouts,
masks and biases given for the global ``Lq x L`` problem, rows with no key anywhere, and
grouped K/V heads. Backward: with each rank's loss a quarter of the one-process loss, the K/V
shard gradients are the one-process gradients' shards and the query gradients sum to its.
The bytes equal the formula (two all-reduces, whatever L).
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist

import attnkit
from attnkit import bias, masks
from attnkit.distributed import attention, count_bytes, shard
from attnkit.distributed.accounting import expected_bytes

from . import cases, spawn

TOL = 1e-12
STEP = 3  # queries of the decoding step
IDS = torch.tensor([0] * 10 + [1] * (cases.LENGTH - 10))
CASES = {
    "none": {},
    "causal": {"mask": masks.causal()},
    "causal window": {"mask": masks.causal() & masks.sliding_window(5)},
    "documents": {"mask": masks.segments(IDS[-STEP:], IDS) & masks.causal()},
    "padding": {"mask": masks.padding([cases.LENGTH - 5, 7])},
    "gqa": {"kv_heads": 4, "mask": masks.causal()},
    "alibi": {"bias": bias.alibi(cases.HEADS), "mask": masks.causal()},
    "no key for one row": {"mask": masks.from_function(lambda b, h, i, j: i != 1, "not_row_1") & masks.causal()},
}


def _compare(layout, kwargs, device=None):
    kwargs = dict(kwargs)
    q, k, v, g_out, g_lse = cases._tensors(11, kwargs.pop("kv_heads", cases.HEADS), cases.LENGTH, device)
    q, g_out, g_lse = q[..., -STEP:, :], g_out[..., -STEP:, :], g_lse[..., -STEP:]
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    want = attnkit.attention(*full, return_lse=True, backend="reference", **kwargs)
    cases._loss(want.output, want.lse, g_out, g_lse).backward()
    local = [q.clone().requires_grad_()] + [shard(t, layout=layout).requires_grad_() for t in (k, v)]
    got = attention(*local, scheme="tree", layout=layout, return_lse=True, **kwargs)
    world = dist.get_world_size()
    cases._loss(got.output, got.lse, g_out / world, g_lse / world).backward()  # the ranks' losses sum to one
    dq = local[0].grad.clone()
    dist.all_reduce(dq)
    return [(got.output - want.output).abs().max().item(), cases._lse_error(got.lse, want.lse),
            (dq - full[0].grad).abs().max().item()] + [
        (a.grad - shard(b.grad, layout=layout)).abs().max().item() for a, b in zip(local[1:], full[1:], strict=True)]


def _bytes(layout):
    q, k, v, _, _ = cases._tensors(4, 4, cases.LENGTH)
    local = [q[..., -STEP:, :].requires_grad_()] + [shard(t, layout=layout).requires_grad_() for t in (k, v)]
    want = expected_bytes(*local, scheme="tree", layout=layout, mask=masks.causal())
    with count_bytes() as forward:
        got = attention(*local, scheme="tree", layout=layout, mask=masks.causal(), return_lse=True)
    with count_bytes() as backward:
        (got.output.sum() + got.lse.sum()).backward()
    return (forward.total, backward.total), want


def _errors():
    q = torch.randn(1, 6, 2, 4)
    k = torch.randn(1, 6, 6, 4)
    calls = {"kv lengths": lambda: attention(q, k, k[..., :4, :], scheme="tree"),
             "mask rows": lambda: attention(q, k, k, scheme="tree", mask=torch.ones(24, 24, dtype=torch.bool))}
    return cases.raised(calls)


def _run(rank, world):
    return {"compare": {(layout, name): _compare(layout, kw)
                        for layout, (name, kw) in itertools.product(cases.LAYOUTS, CASES.items())},
            "bytes": {layout: _bytes(layout) for layout in cases.LAYOUTS}, "errors": _errors()}


@pytest.fixture(scope="module")
def tree_runs():
    return spawn.run(_run, 4)


@pytest.mark.parametrize(("layout", "case"), list(itertools.product(cases.LAYOUTS, CASES)))
def test_a_decoding_step_matches_one_process(tree_runs, layout, case):
    for rank, found in enumerate(tree_runs):
        errors = found["compare"][layout, case]
        assert max(errors) <= TOL, f"rank {rank}: output, lse, dq (summed), dk, dv errors {errors}"


@pytest.mark.parametrize("layout", cases.LAYOUTS)
def test_measured_bytes_equal_the_formula(tree_runs, layout):
    for found in tree_runs:
        got, want = found["bytes"][layout]
        assert got == want


@pytest.mark.parametrize(("name", "kind", "words"), [("kv lengths", "ShapeError", "share their length"),
                                                     ("mask rows", "ShapeError", "(B, H, Lq, L)")])
def test_bad_calls_raise_clear_errors(tree_runs, name, kind, words):
    for found in tree_runs:
        got_kind, message = found["errors"][name]
        assert got_kind == kind and words in message, (got_kind, message)
