"""benchmarks/compiled.py: the compiled window rows run the suite's row code with attnkit's side compiled.

Compiling takes tens of seconds, so the run is marked slow; no timed assertion.
"""

from __future__ import annotations

import pytest

from attnkit.lab.benchmarking.rows import Spec, run_spec
from benchmarks import compiled


def test_the_rows_compare_compiled_attnkit_with_compiled_sdpa_and_eager_attnkit():
    forward, both = compiled.specs(4096, 8, 5)
    assert forward.compiled and both.compiled and not forward.case.backward and both.case.backward
    assert forward.compare == ("compiled-sdpa-mask", "attnkit-eager") and forward.goals == (0.2, 1.15)
    assert Spec.from_json(both.to_json()) == both  # the memory child rebuilds the spec from its JSON


@pytest.mark.slow
def test_the_compiled_rows_compute_the_same_function_at_a_small_size():
    for spec in compiled.specs(256, 2, 1):
        rows = run_spec(spec)
        assert rows[0].theirs == "compiled torch sdpa (dense bool mask)" and rows[1].theirs.startswith("attnkit auto")
        assert all(r.ours.startswith("compiled attnkit") and r.diff_ok for r in rows)
