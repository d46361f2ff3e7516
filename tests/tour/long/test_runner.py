"""Running the long suite (src/attnkit/tour/long/runner.py) in fresh processes, its cache, and its report."""

from __future__ import annotations

import json

from attnkit.tour.long import report, run_suite
from attnkit.tour.long.runner import speed_path, suite_version
from attnkit.tour.runner import run_path


def test_a_tiny_suite_runs_in_fresh_processes_resumes_and_writes_its_report(tmp_path):
    pairs = [("byte_retrieval", "linear")]
    summary = run_suite(tmp_path, quick=True, pairs=pairs, seeds=(0, 1), progress=False)
    assert not summary.failed, summary.failed
    assert sorted(summary.ran) == ["byte_retrieval/linear seed 0", "byte_retrieval/linear seed 1", "speed linear"]
    records = [json.loads(run_path(tmp_path, "byte_retrieval", "linear", s, "quick").read_text()) for s in (0, 1)]
    for rec in records:
        assert rec["status"] == "ok" and rec["version"] == suite_version()
        assert rec["result"]["peak_bytes"] > 2**20  # a fresh process grew while it trained
        assert rec["result"]["extra"]["steps_per_second"] > 0
    speed = json.loads(speed_path(tmp_path, "linear", "quick").read_text())
    assert speed["status"] == "ok" and speed["result"]["length"] == 512

    run_path(tmp_path, "byte_retrieval", "linear", 1, "quick").unlink()  # as if interrupted before seed 1
    again = run_suite(tmp_path, quick=True, pairs=pairs, seeds=(0, 1), progress=False)
    assert again.ran == ["byte_retrieval/linear seed 1"]
    assert sorted(again.cached) == ["byte_retrieval/linear seed 0", "speed linear"]
    redone = json.loads(run_path(tmp_path, "byte_retrieval", "linear", 1, "quick").read_text())
    assert redone["result"]["accuracy"] == records[1]["result"]["accuracy"]  # same seed, same run

    markdown, page = report.write(tmp_path)
    text = markdown.read_text()
    assert "This is a `--quick` report" in text and "| linear |" in text and "![accuracy vs speed" in text
    html = page.read_text()
    assert "data:image/png;base64," in html and "http://" not in html and "https://" not in html
