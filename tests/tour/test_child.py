"""One tour run in a fresh process (src/attnkit/tour/child.py), through the runner's ``isolate`` path."""

from __future__ import annotations

import json

import pytest

from attnkit.tour import experiments, runner


def test_a_failing_run_in_its_process_is_a_failed_record_with_its_traceback():
    exp = experiments()["han_documents/han"]
    record = runner._run_one("han_documents/nosuch", exp, 0, True, "v", None, isolate=True)
    assert record["status"] == "failed" and record["result"] is None
    assert "unknown experiment 'han_documents/nosuch'" in record["error"]
    assert "Traceback" in record["traceback"] and "ArgumentError" in record["traceback"]


@pytest.mark.slow
def test_each_run_measures_its_peak_memory_in_a_fresh_process(tmp_path):
    labels = []
    record = runner._run_one("han_documents/han", experiments()["han_documents/han"], 0, True, "v", labels.append,
                             isolate=True)
    assert record["status"] == "ok", record["traceback"]
    assert record["result"]["peak_bytes"] > 2**20  # training grew a process no earlier run had used
    assert labels[-1].startswith("test") and any(label.startswith("step ") for label in labels)
    json.dumps(record)
    in_process = runner._run_one("han_documents/han", experiments()["han_documents/han"], 0, True, "v", None,
                                 isolate=False)
    assert in_process["result"]["peak_bytes"] is None  # not measurable here: dropped, not 0
    assert in_process["result"]["accuracy"] == record["result"]["accuracy"]  # the same run, the same seed
