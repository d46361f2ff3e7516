"""attnkit.distributed on NCCL with CUDA tensors: the gloo tests' cases, each rank's tensors on its own GPU.

Two processes, rank r on GPU r (skipped without two GPUs and NCCL: ``python -m pytest -m nccl``
runs them where they are). Every scheme x layout x case of :mod:`tests.distributed.cases`, the
2 x 1 mesh of ``usp`` and a decoding step of ``tree`` against one process in float64 on the same
GPU: outputs, lse and gradients within 1e-12.
"""

from __future__ import annotations

import itertools

import pytest

from attnkit.distributed import SCHEMES

from . import cases, spawn, test_tree

TOL = 1e-12
WORLD = 2


def _run(rank, world):
    device = f"cuda:{rank}"
    return {"sweep": cases.sweep(device=device),
            "tree": {(layout, name): test_tree._compare(layout, kw, device)
                     for layout, (name, kw) in itertools.product(cases.LAYOUTS, test_tree.CASES.items())}}


@pytest.fixture(scope="module")
def nccl_runs():
    return spawn.run(_run, WORLD, backend="nccl")


@pytest.mark.nccl
@pytest.mark.parametrize(("scheme", "layout", "case"),
                         list(itertools.product(SCHEMES, cases.LAYOUTS, cases.cases())))
def test_every_scheme_on_nccl_matches_one_process(nccl_runs, scheme, layout, case):
    for rank, found in enumerate(nccl_runs):
        errors = found["sweep"][scheme, layout, case]
        assert max(errors) <= TOL, f"rank {rank}: output, lse, dq, dk, dv errors {errors}"


@pytest.mark.nccl
@pytest.mark.parametrize(("layout", "case"), list(itertools.product(cases.LAYOUTS, test_tree.CASES)))
def test_a_decoding_step_on_nccl_matches_one_process(nccl_runs, layout, case):
    for rank, found in enumerate(nccl_runs):
        assert max(found["tree"][layout, case]) <= TOL, f"rank {rank}: {found['tree'][layout, case]}"
