"""Differential fuzzing: random calls on every backend against float64 oracles (tests/fuzz/differential.py).

The quick profile runs in the default suite: a fixed seed and a fixed number of cases, so it is
deterministic and bounded; so do a quick profile of calls with infinite queries or keys (RELIABILITY
row 21) and one of the other surfaces (packed documents, paged caches, the linear recurrences,
FlexAttention's API: tests/fuzz/surfaces.py). The long profiles
(``-m slow``) run 5,000 calls of attention and 2,000 of the other surfaces::

    .venv/bin/python -m pytest -m slow tests/fuzz/test_differential.py

Every failure the fuzzer finds becomes a named test in tests/fuzz/test_regressions.py.
"""

from __future__ import annotations

import warnings
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import attnkit
from attnkit.kernels import online_softmax
from tests.fuzz.cases import Case, cases
from tests.fuzz.differential import check
from tests.fuzz.surfaces import SURFACES, check_surface, surface_calls

_COMMON = dict(deadline=None, suppress_health_check=list(HealthCheck), print_blob=True)


def _run(case: Case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # once-only fallback notes are not failures
        check(case)


@seed(20261201)
@settings(max_examples=60, derandomize=True, database=None, **_COMMON)
@given(cases())
def test_quick_profile(case):
    _run(case)


@seed(20261208)
@settings(max_examples=30, derandomize=True, database=None, **_COMMON)
@given(cases().filter(lambda case: case.infinite is not None))
def test_quick_profile_of_infinite_queries_and_keys(case):
    """Calls with ``-inf`` scores from infinite q or k (a quarter of the long profile's softmax calls): RELIABILITY
    row 21's NaN rows, rows 6 and 51 beside a bias or a sink."""
    _run(case)


@pytest.mark.slow
@settings(max_examples=5000, database=None, **_COMMON)
@given(cases())
def test_long_profile(case):
    _run(case)


@pytest.mark.parametrize("kind", list(SURFACES))
@seed(20261207)
@settings(max_examples=6, derandomize=True, database=None, **_COMMON)
@given(data=st.data())
def test_quick_profile_of_the_other_surfaces(kind, data):
    check_surface(data.draw(SURFACES[kind]))


@pytest.mark.slow
@settings(max_examples=2000, database=None, **_COMMON)
@given(surface_calls())
def test_long_profile_of_the_other_surfaces(call):
    check_surface(call)


def test_the_check_catches_a_kernel_that_answers_a_row_of_minus_infinity_with_zero():
    """Row 21: a row whose allowed scores are all ``-inf`` from an infinite key is NaN; a kernel that reads it as a
    row the mask empties (0, finding 39's bug) fails the check."""
    case = Case(rank=4, batch=1, heads=2, kv_heads=1, lq=9, lk=9, d=4, dv=4, dtype=torch.float64, seed=1,
                mask=attnkit.masks.causal(), infinite=("keys", "every"))
    q, k, v, _ = case.tensors()
    assert attnkit.attention(q, k, v, mask=case.mask).isnan().all()  # every key -inf: every row NaN
    _run(case)
    real = online_softmax._slab

    def zeroed(*args):
        out, lse = real(*args)
        return out.nan_to_num(0.0), lse

    with mock.patch.object(online_softmax, "_slab", zeroed), pytest.raises(AssertionError, match="online-softmax"):
        _run(case)


def test_the_check_catches_a_kernel_off_by_five_in_ten_thousand():
    real = online_softmax._slab

    def off(*args):
        out, lse = real(*args)
        return out * 1.0005, lse

    case = Case(rank=4, batch=2, heads=2, kv_heads=1, lq=70, lk=90, d=8, dv=5, dtype=torch.float32, seed=3,
                mask=attnkit.masks.causal(), normalize="softmax", grad=True)
    _run(case)  # the real kernel passes
    with mock.patch.object(online_softmax, "_slab", off), pytest.raises(AssertionError, match="online-softmax"):
        _run(case)
