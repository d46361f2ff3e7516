"""The long suite's jobs (src/attnkit/tour/long/jobs.py), as the child process runs them."""

from __future__ import annotations

import pytest

from attnkit.errors import ArgumentError
from attnkit.lab.tour.child import ChildFailed, run_child
from attnkit.lab.tour.long.jobs import run_job, speed_job, train_job


def test_a_speed_job_emits_one_measurement_at_the_scales_length_and_a_bad_kind_is_refused():
    got, labels = [], []
    run_job(speed_job("linear", "quick"), labels.append, got.append)
    assert len(got) == 1 and got[0]["mechanism"] == "linear" and got[0]["length"] == 256
    with pytest.raises(ArgumentError, match="unknown job kind 'nope'"):
        run_job({"suite": "long", "kind": "nope"}, labels.append, got.append)
    assert train_job("pixel_legend", "lambda", (0, 2), "quick") == {
        "suite": "long", "kind": "train", "task": "pixel_legend", "mechanism": "lambda", "seeds": [0, 2],
        "scale": "quick", "device": "cpu"}


def test_a_failing_job_in_its_process_is_a_child_failure_with_its_traceback():
    with pytest.raises(ChildFailed, match="unknown mechanism 'nosuch'") as err:
        run_child(train_job("byte_context", "nosuch", [0], "quick"), None)
    assert "Traceback" in err.value.log
