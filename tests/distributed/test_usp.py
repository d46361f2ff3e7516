"""distributed/usp.py: Ulysses x ring on a 2 x 2 mesh of gloo processes, against one process in float64.

One spawn of 4 processes: every case of :mod:`tests.distributed.cases` on both layouts with
``ulysses_size=2`` (two Ulysses groups of 2 ranks, two rings of 2 ranks), outputs, lse and
the gradients of q, k, v within 1e-12; K/V heads fewer than the ranks (2 and 1, where Ulysses
alone cannot shard them without repeating); the bytes against the formula; the refusals.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.distributed import attention

from . import cases, spawn

TOL = 1e-12
MESH = {"ulysses_size": 2}
FEW_KV_HEADS = {  # kv heads, options: the default mesh for H_kv = 2 is 2 x 2 already
    "2 kv heads, default mesh": (2, {}),
    "1 kv head, repeated": (1, MESH),
}
HEAD_BIAS = torch.randn(1, cases.HEADS, cases.LENGTH, cases.LENGTH, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(9))  # each rank reads its heads' slice
BYTE_MASKS = {"none": None, "causal": masks.causal(), "window_both_sides": masks.sliding_window(2, 2)}


def _errors():
    q = torch.randn(1, 6, 6, 4)
    calls = {"size": lambda: attention(q, q, q, scheme="usp", ulysses_size=3),
             "not usp": lambda: attention(q, q, q, scheme="ring", ulysses_size=2),
             "learned": lambda: attention(q, q, q, scheme="usp", bias=attnkit.bias.RelativePositionBias(6))}
    return cases.raised(calls)


def _run(rank, world):
    every = {**cases.cases(), "tensor_bias": {"bias": HEAD_BIAS, "mask": masks.causal()}}
    found = {"sweep": {(layout, name): cases.compare("usp", layout, kw, options=MESH)
                       for (name, kw), layout in itertools.product(every.items(), cases.LAYOUTS)}}
    found["few"] = {(layout, name): cases.compare("usp", layout, {"kv_heads": kv, "mask": masks.causal()},
                                                  options=options)
                    for (name, (kv, options)), layout in itertools.product(FEW_KV_HEADS.items(), cases.LAYOUTS)}
    found["bytes"] = {(layout, m, lse): cases.measured_bytes("usp", layout, mask=BYTE_MASKS[m], kv_heads=2,
                                                             return_lse=lse, expected=True, options=MESH)
                      for layout, m, lse in itertools.product(cases.LAYOUTS, BYTE_MASKS, (False, True))}
    found["errors"] = _errors()
    return found


@pytest.fixture(scope="module")
def usp_runs():
    return spawn.run(_run, 4)


@pytest.mark.parametrize(("layout", "case"), list(itertools.product(cases.LAYOUTS, [*cases.cases(), "tensor_bias"])))
def test_a_2x2_mesh_matches_one_process_forward_and_backward(usp_runs, layout, case):
    for rank, found in enumerate(usp_runs):
        errors = found["sweep"][layout, case]
        assert max(errors) <= TOL, f"rank {rank}: output, lse, dq, dk, dv errors {errors}"


@pytest.mark.parametrize(("layout", "case"), list(itertools.product(cases.LAYOUTS, FEW_KV_HEADS)))
def test_kv_heads_fewer_than_the_ranks_are_served(usp_runs, layout, case):
    for rank, found in enumerate(usp_runs):
        assert max(found["few"][layout, case]) <= TOL, f"rank {rank}: {found['few'][layout, case]}"


def test_measured_bytes_equal_the_formula(usp_runs):
    for rank, found in enumerate(usp_runs):
        for key, (got, want) in found["bytes"].items():
            assert got == want, f"rank {rank} {key}: measured {got}, formula {want}"
        # the reshard moves as much for any mask; the ring stage sends less under a causal mask
        assert found["bytes"]["contiguous", "causal", False][0] <= found["bytes"]["contiguous", "none", False][0]


@pytest.mark.parametrize(("name", "kind", "words"), [("size", "ShapeError", "ulysses_size=3"),
                                                     ("not usp", "ArgumentError", "scheme='usp'"),
                                                     ("learned", "ArgumentError", "learned bias")])
def test_bad_calls_raise_clear_errors(usp_runs, name, kind, words):
    for found in usp_runs:
        got_kind, message = found["errors"][name]
        assert got_kind == kind and words in message, (got_kind, message)
