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


def test_a_train_job_carries_its_learning_rate_factor_to_the_training(monkeypatch):
    from attnkit.lab.tour.long import jobs

    assert train_job("pixel_legend", "lambda", [0], "quick", lr_scale=3.0)["lr_scale"] == 3.0
    assert "lr_scale" not in train_job("pixel_legend", "lambda", [0], "quick", lr_scale=1.0)
    seen = []
    monkeypatch.setattr(jobs, "train_pair", lambda *args, **kw: seen.append(kw["lr_scale"]))
    run_job(train_job("pixel_legend", "lambda", [0], "quick", lr_scale=1 / 3), None, None)
    run_job(train_job("pixel_legend", "lambda", [0], "quick"), None, None)
    assert seen == [1 / 3, 1.0]


def test_train_pair_multiplies_the_setups_learning_rate(monkeypatch):
    from attnkit.lab.tour.long import suite, train

    rates = []

    def stop_at_fit(model, task, objective, budget, **kw):
        rates.append(budget.lr)
        raise StopIteration  # the rate is what this test reads, not the training

    monkeypatch.setattr(train, "fit", stop_at_fit)
    setup = suite.plan("quick").setups[0]
    for factor in (1.0, 3.0):
        with pytest.raises(StopIteration):
            train.train_pair(setup.task, setup.mechanisms[0], [0], scale="quick", lr_scale=factor)
    assert rates == [setup.budget.lr, pytest.approx(3 * setup.budget.lr)]
