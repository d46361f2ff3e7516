"""The long suite's jobs (src/attnkit/tour/long/jobs.py), as the child process runs them."""

from __future__ import annotations

import pytest

from attnkit.errors import ArgumentError
from attnkit.tour.long.jobs import run_job, speed_job, train_job
from attnkit.tour.runner import ChildFailed, run_child


def test_a_speed_job_emits_one_measurement_and_a_bad_kind_is_refused():
    got, labels = [], []
    run_job(speed_job("linear", 32), labels.append, got.append)
    assert len(got) == 1 and got[0]["mechanism"] == "linear" and got[0]["length"] == 32
    with pytest.raises(ArgumentError, match="unknown job kind 'nope'"):
        run_job({"suite": "long", "kind": "nope"}, labels.append, got.append)
    assert train_job("pathfinder", "lambda", (0, 2), True) == {
        "suite": "long", "kind": "train", "task": "pathfinder", "mechanism": "lambda", "seeds": [0, 2], "quick": True}


def test_a_failing_job_in_its_process_is_a_child_failure_with_its_traceback():
    with pytest.raises(ChildFailed, match="unknown mechanism 'nosuch'") as err:
        run_child(train_job("byte_text", "nosuch", [0], True), None)
    assert "Traceback" in err.value.log
