"""One tour run in a fresh process (src/attnkit/tour/child.py), through the runner's ``isolate`` path."""

from __future__ import annotations

import json

import pytest

from attnkit.lab.tour import experiments, runner


def test_a_failing_run_in_its_process_is_a_failed_record_with_its_traceback():
    exp = experiments()["han_documents/han"]
    record = runner._run_one("han_documents/nosuch", exp, 0, True, "v", None, isolate=True)
    assert record["status"] == "failed" and record["result"] is None
    assert "unknown experiment 'han_documents/nosuch'" in record["error"]
    assert "Traceback" in record["traceback"] and "ArgumentError" in record["traceback"]


@pytest.mark.slow
@pytest.mark.parametrize("key", ["han_documents/han", "deciding_position/soft", "dates/none"])
def test_each_run_measures_its_time_and_peak_memory_in_a_fresh_process(key):
    """The classic rows too: every row of the committed table gets a time and a peak memory."""
    labels = []
    record = runner._run_one(key, experiments()[key], 0, True, "v", labels.append, isolate=True)
    assert record["status"] == "ok", record["traceback"]
    assert record["result"]["peak_bytes"] > 2**20  # training grew a process no earlier run had used
    assert record["result"]["train_seconds"] > 0
    assert labels[-1].startswith("test") and any(label.startswith("step ") for label in labels)
    json.dumps(record)
    in_process = runner._run_one(key, experiments()[key], 0, True, "v", None, isolate=False)
    assert in_process["result"]["peak_bytes"] is None  # not measurable here: dropped, not 0
    assert in_process["result"]["accuracy"] == record["result"]["accuracy"]  # the same run, the same seed


def test_the_process_passes_a_learning_rate_factor_to_the_run_only_when_one_is_asked(monkeypatch, capsys):
    import torch

    from attnkit.lab.tour import child

    calls = []

    class Api:
        @staticmethod
        def run(key, seed, *, quick, progress, **options):
            calls.append(options)
            return {"key": key, "seed": seed}

    monkeypatch.setattr(child, "api", lambda: Api)
    threads = torch.get_num_threads()
    try:
        child.main({"key": "k", "seed": 0, "quick": True, "threads": threads})
        child.main({"key": "k", "seed": 0, "quick": True, "threads": threads, "lr_scale": 3.0})
    finally:
        torch.set_num_threads(threads)
    assert calls == [{}, {"lr_scale": 3.0}]
    assert capsys.readouterr().out.count(child.RESULT) == 2
