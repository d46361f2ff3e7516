"""Running the long suite (src/attnkit/tour/long/runner.py) in fresh processes, its saved runs, and its report."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab.tour import store
from attnkit.lab.tour.long import report, run_suite, runner
from attnkit.lab.tour.long.runner import default_workers, speed_path, suite_version
from attnkit.lab.tour.long.suite import plan
from attnkit.lab.tour.store import run_path


def test_a_tiny_suite_runs_in_fresh_processes_resumes_and_writes_its_report(tmp_path):
    pairs = [("byte_context", "linear")]
    summary = run_suite(tmp_path, scale="quick", pairs=pairs, seeds=(0, 1), speed=["linear"], progress=False,
                        workers=2)
    assert not summary.failed, summary.failed
    assert sorted(summary.ran) == ["byte_context/linear seed 0", "byte_context/linear seed 1", "speed linear"]
    records = [json.loads(run_path(tmp_path, "byte_context", "linear", s, "quick").read_text()) for s in (0, 1)]
    assert sum(rec["wall_seconds"] for rec in records) <= summary.seconds  # each seed's own time, not cumulative
    for rec in records:
        assert rec["status"] == "ok" and rec["version"] == suite_version() and rec["mode"] == "quick"
        assert rec["result"]["peak_bytes"] > 2**20  # a fresh process grew while it trained
        assert rec["result"]["extra"]["steps_per_second"] > 0 and 0 < rec["result"]["extra"]["chance"] <= 1
    speed = json.loads(speed_path(tmp_path, "linear", "quick").read_text())
    assert speed["status"] == "ok" and speed["result"]["length"] == 256 and len(speed["result"]["step_seconds"]) == 5
    manifest = json.loads((tmp_path / "tour.json").read_text())
    assert manifest["suite"] == "long" and manifest["workers"] == 2 and manifest["keys"] == [f"{t}/{m}" for t, m in
                                                                                          pairs]

    run_path(tmp_path, "byte_context", "linear", 1, "quick").unlink()  # as if interrupted before seed 1
    again = run_suite(tmp_path, scale="quick", pairs=pairs, seeds=(0, 1), speed=["linear"], progress=False)
    assert again.ran == ["byte_context/linear seed 1"]
    assert sorted(again.cached) == ["byte_context/linear seed 0", "speed linear"]
    redone = json.loads(run_path(tmp_path, "byte_context", "linear", 1, "quick").read_text())
    assert redone["result"]["accuracy"] == records[1]["result"]["accuracy"]  # same seed, same run

    markdown, page = report.write(tmp_path)
    text = markdown.read_text()
    assert "This is a `--quick` report" in text and "| linear |" in text and "![accuracy vs speed" in text
    html = page.read_text()
    assert "data:image/png;base64," in html and "http://" not in html and "https://" not in html


def test_two_workers_train_two_pairs_at_once_longest_sequences_first(tmp_path, monkeypatch):
    started, running, most, shares = [], [], [], []
    lock = threading.Lock()

    def fake_train(out, task, mechanism, seeds, the_plan, version, device, step, summary, threads=1, lr_scale=1.0):
        with lock:
            shares.append(threads)
            started.append(task)
            running.append(task)
            most.append(len(running))
        time.sleep(0.2)
        with lock:
            running.remove(task)
        summary.ran.append(f"{task}/{mechanism}")

    monkeypatch.setattr(runner, "_train", fake_train)
    pairs = [("pixel_legend", "lambda"), ("byte_context", "linear"), ("associative_recall", "linear")]
    summary = runner.run_suite(tmp_path, scale="quick", pairs=pairs, speed=(), progress=False, workers=2)
    assert sorted(summary.ran) == sorted(f"{t}/{m}" for t, m in pairs) and max(most) == 2
    assert started[0] == "pixel_legend"  # 256 tokens, the others 128: the costliest pair starts first
    assert set(shares) == {max(1, torch.get_num_threads() // 2)}  # two pairs at once share this process's threads


def test_a_folder_where_a_run_file_belongs_stops_the_suite_before_it_trains(tmp_path):
    run_path(tmp_path, "byte_context", "linear", 0, "quick").mkdir(parents=True)
    with pytest.raises(ArgumentError, match="a folder is in the way"):
        run_suite(tmp_path, scale="quick", pairs=[("byte_context", "linear")], seeds=(0,), speed=(), progress=False)


def test_an_unknown_task_of_the_scale_is_an_error_and_workers_follow_the_device():
    with pytest.raises(ArgumentError, match="no task 'long_listops'"):
        run_suite("unused", scale="quick", pairs=[("long_listops", "linear")], progress=False)
    assert default_workers("cuda") == 1 and 1 <= default_workers("cpu") <= 2


def _fake_child(jobs):
    def child(job, step, on_result=None):
        jobs.append(job)
        results = [{"seed": seed, "accuracy": 0.5 * job.get("lr_scale", 1.0)} for seed in job["seeds"]]
        for result in results:
            on_result(result)
        return results
    return child


def test_a_sweep_trains_each_pair_at_every_rate_keyed_apart_and_a_plain_suite_at_its_own(tmp_path, monkeypatch):
    jobs = []
    monkeypatch.setattr(runner, "run_child", _fake_child(jobs))
    setup = plan("quick").setups[0]
    pair = (setup.task, setup.mechanisms[0])
    runner.run_suite(tmp_path, scale="quick", progress=False, pairs=[pair], seeds=[0], speed=[], workers=1)
    assert len(jobs) == 1 and "lr_scale" not in jobs[0]
    summary = runner.run_suite(tmp_path, scale="quick", progress=False, pairs=[pair], seeds=[0], speed=[],
                               workers=1, lr_sweep=True)
    assert sorted(job.get("lr_scale", 1.0) for job in jobs[1:]) == [1 / 3, 3.0]  # the plain run is reused
    assert summary.cached == [f"{pair[0]}/{pair[1]} seed 0"]
    names = sorted(p.name for p in (tmp_path / "runs" / "quick").glob("*__seed0.json"))
    assert names == sorted(store.run_path(tmp_path, *pair, 0, "quick", f).name for f in store.LR_SWEEP)
    saved = store.load_run(store.run_path(tmp_path, *pair, 0, "quick", 3.0))
    assert saved["lr_scale"] == 3.0 and saved["lr"] == 3.0 * setup.budget.lr
    best = store.load_records(tmp_path)
    assert [(r["lr_scale"], r["result"]["accuracy"]) for r in best] == [(3.0, 1.5)]
