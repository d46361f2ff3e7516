"""The tour runner: cache per run, resume, atomic writes, corrupt or stale caches redone, failures recorded.

The experiments API (``attnkit.lab.tour.experiments/default_set/run``) is replaced by a fake
whose runs take no time, so these tests check only the runner's bookkeeping.
"""

from __future__ import annotations

import json
import sys
import threading
import types
from dataclasses import dataclass, field

import pytest
import torch

import attnkit.lab.tour as tour_pkg
from attnkit.errors import ArgumentError
from attnkit.lab.tour import runner, store


@dataclass(frozen=True)
class FakeExperiment:
    task: str
    mechanism: str
    description: str


@dataclass
class FakeResult:
    key: str
    task: str
    mechanism: str
    seed: int
    accuracy: float
    train_seconds: float = 1.5
    peak_bytes: int = 3 * 2**20
    parameters: int = 1234
    curve: list = field(default_factory=lambda: [(0, 2.0, 0.1), (10, 1.0, 0.5), (20, 0.5, 0.9)])
    examples: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        examples = [{**e, "maps": {n: w.tolist() for n, w in e["maps"].items()}} for e in self.examples]
        return {**self.__dict__, "curve": [list(p) for p in self.curve], "examples": examples}


EXPERIMENTS = {
    "mqar/softmax": FakeExperiment("mqar", "softmax", "2-layer softmax transformer on recall"),
    "mqar/linear": FakeExperiment("mqar", "linear", "linear attention on recall"),
    "dates/additive": FakeExperiment("dates", "additive", "seq2seq with Bahdanau attention"),
}
ACCURACY = {("mqar/softmax", 0): 0.9, ("mqar/softmax", 1): 0.8, ("mqar/softmax", 2): 1.0,
            ("mqar/linear", 0): 0.3, ("mqar/linear", 1): 0.5, ("mqar/linear", 2): 0.4,
            ("dates/additive", 0): 0.97, ("dates/additive", 1): 0.99, ("dates/additive", 2): 0.98}


def make_result(key: str, seed: int) -> FakeResult:
    exp = EXPERIMENTS[key]
    g = torch.Generator().manual_seed(seed)
    if exp.task == "dates":  # a seq2seq alignment (T, S) with tokens
        maps = {"alignment": torch.softmax(torch.randn(1, 4, 6, generator=g), -1)}
        example = {"title": "1 Jan 2001", "maps": maps, "q_tokens": list("2001"), "k_tokens": list("1 Jan ")}
    else:
        maps = {"layer 0": torch.softmax(torch.randn(3, 5, 7, generator=g), -1),
                "layer 1": torch.softmax(torch.randn(3, 5, 7, generator=g), -1)}
        example = {"title": "recall example", "maps": maps, "q_tokens": None, "k_tokens": None}
    return FakeResult(key, exp.task, exp.mechanism, seed, ACCURACY[key, seed], train_seconds=1.0 + seed,
                      peak_bytes=(seed + 1) * 2**20, examples=[example], extra={"attention_on_key": 0.5 + seed / 10})


class FakeAPI:
    """Stands in for attnkit.lab.tour's experiments API; records every run() call."""

    def __init__(self, fail=(), interrupt_after=None):
        self.calls, self.fail, self.interrupt_after = [], set(fail), interrupt_after
        self.progress_seen = []

    def run(self, key, seed, *, quick=False, progress=None):
        if self.interrupt_after is not None and len(self.calls) == self.interrupt_after:
            raise KeyboardInterrupt
        self.calls.append((key, seed, quick))
        self.progress_seen.append(progress)
        if progress is not None:
            progress("step 1")
        if key in self.fail:
            raise RuntimeError(f"boom in {key}")
        return make_result(key, seed)


@pytest.fixture
def fake(monkeypatch):
    """Install a FakeAPI as attnkit.lab.tour.{experiments, default_set, run}; returns a function to swap it."""
    def install(api: FakeAPI) -> FakeAPI:
        monkeypatch.setattr(tour_pkg, "experiments", lambda: dict(EXPERIMENTS), raising=False)
        monkeypatch.setattr(tour_pkg, "default_set", lambda quick: list(EXPERIMENTS)[: 2 if quick else 3],
                            raising=False)
        monkeypatch.setattr(tour_pkg, "run", api.run, raising=False)
        return api
    return install


def _tour(out, **kw):
    kw.setdefault("progress", False)
    kw.setdefault("isolate", False)  # the fake experiments live in this process
    kw.setdefault("scaling", False)
    return runner.tour(out=out, **kw)


def test_each_run_is_written_and_a_rerun_calls_nothing(tmp_path, fake):
    api = fake(FakeAPI())
    summary = _tour(tmp_path, seeds=(0, 1))
    assert sorted(api.calls) == sorted((k, s, False) for k in EXPERIMENTS for s in (0, 1))
    assert len(summary.ran) == 6 and not summary.cached and not summary.failed
    path = tmp_path / "runs" / "default" / "mqar__softmax__seed1.json"
    record = json.loads(path.read_text())
    assert record["status"] == "ok" and record["result"]["accuracy"] == 0.8 and record["mode"] == "default"
    again = fake(FakeAPI(fail=set(EXPERIMENTS)))  # would fail if it ran anything
    summary = _tour(tmp_path, seeds=(0, 1))
    assert again.calls == [] and len(summary.cached) == 6 and not summary.ran


def test_fresh_runs_everything_again(tmp_path, fake):
    fake(FakeAPI())
    _tour(tmp_path, keys=["mqar/linear"], seeds=(0,))
    api = fake(FakeAPI())
    _tour(tmp_path, keys=["mqar/linear"], seeds=(0,), fresh=True)
    assert api.calls == [("mqar/linear", 0, False)]


def test_an_interrupted_tour_keeps_finished_runs_and_resumes(tmp_path, fake):
    fake(FakeAPI(interrupt_after=2))
    with pytest.raises(KeyboardInterrupt):
        _tour(tmp_path, seeds=(0, 1))
    files = sorted(p.name for p in (tmp_path / "runs" / "default").iterdir())
    assert len(files) == 2 and all(p.endswith(".json") for p in files)  # no temporary files left
    for name in files:
        assert store.load_run(tmp_path / "runs" / "default" / name)["status"] == "ok"
    api = fake(FakeAPI())
    _tour(tmp_path, seeds=(0, 1))
    assert len(api.calls) == 4  # only the 4 runs the interruption lost


def test_write_json_is_atomic_when_writing_fails(tmp_path):
    path = tmp_path / "run.json"
    store.write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        store.write_json(path, {"a": object()})  # json.dump fails half-way through the file
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]


def test_a_corrupt_or_truncated_cache_is_redone(tmp_path, fake):
    fake(FakeAPI())
    _tour(tmp_path, seeds=(0, 1))
    folder = tmp_path / "runs" / "default"
    text = (folder / "mqar__linear__seed1.json").read_text()
    (folder / "mqar__linear__seed1.json").write_text(text[: len(text) // 2])
    (folder / "dates__additive__seed0.json").write_text(json.dumps({"status": "ok"}))  # valid JSON, not a run
    api = fake(FakeAPI())
    _tour(tmp_path, seeds=(0, 1))
    assert sorted(api.calls) == [("dates/additive", 0, False), ("mqar/linear", 1, False)]
    assert store.load_run(folder / "mqar__linear__seed1.json")["result"]["accuracy"] == 0.5


def test_quick_and_default_modes_are_cached_apart(tmp_path, fake):
    api = fake(FakeAPI())
    _tour(tmp_path, keys=["mqar/softmax"], seeds=(0,), quick=True)
    _tour(tmp_path, keys=["mqar/softmax"], seeds=(0,))
    assert api.calls == [("mqar/softmax", 0, True), ("mqar/softmax", 0, False)]
    assert (tmp_path / "runs" / "quick" / "mqar__softmax__seed0.json").exists()
    assert store.load_run(tmp_path / "runs" / "quick" / "mqar__softmax__seed0.json", mode="default") is None


def test_a_new_code_version_reruns(tmp_path, fake, monkeypatch):
    fake(FakeAPI())
    _tour(tmp_path, keys=["mqar/softmax"], seeds=(0,))
    monkeypatch.setattr(runner, "code_version", lambda: "0.0.0+other")
    api = fake(FakeAPI())
    _tour(tmp_path, keys=["mqar/softmax"], seeds=(0,))
    assert api.calls == [("mqar/softmax", 0, False)]


def test_a_failing_run_is_recorded_the_tour_goes_on_and_a_rerun_retries_it(tmp_path, fake):
    api = fake(FakeAPI(fail={"mqar/linear"}))
    summary = _tour(tmp_path, seeds=(0,))
    assert [c[0] for c in api.calls] == list(EXPERIMENTS)
    assert summary.failed == ["mqar/linear seed 0"] and len(summary.ran) == 2
    record = store.load_run(tmp_path / "runs" / "default" / "mqar__linear__seed0.json")
    assert record["status"] == "failed" and record["error"] == "RuntimeError: boom in mqar/linear"
    assert "Traceback" in record["traceback"] and record["result"] is None
    api = fake(FakeAPI())
    _tour(tmp_path, seeds=(0,))
    assert api.calls == [("mqar/linear", 0, False)]


def test_a_result_that_cannot_be_written_as_json_is_a_failed_run(tmp_path, fake, monkeypatch):
    api = fake(FakeAPI())
    monkeypatch.setattr(tour_pkg, "run", lambda key, seed, **kw: FakeResult(key, "mqar", "softmax", seed, 0.5,
                                                                            extra={"bad": object()}), raising=False)
    summary = _tour(tmp_path, keys=["mqar/softmax"], seeds=(0,))
    assert summary.failed == ["mqar/softmax seed 0"] and api.calls == []
    record = store.load_run(tmp_path / "runs" / "default" / "mqar__softmax__seed0.json")
    assert record["status"] == "failed" and record["error"].startswith("TypeError")


def test_default_set_and_manifest(tmp_path, fake):
    api = fake(FakeAPI())
    _tour(tmp_path, seeds=(2,), quick=True, command="attnkit tour --quick")
    assert [c[0] for c in api.calls] == ["mqar/softmax", "mqar/linear"]
    manifest = json.loads((tmp_path / "tour.json").read_text())
    assert manifest["mode"] == "quick" and manifest["seeds"] == [2] and manifest["command"] == "attnkit tour --quick"
    assert manifest["machine"]["torch"] == torch.__version__ and manifest["seconds"] >= 0


@pytest.mark.parametrize(("keys", "seeds", "match"), [
    (["nope/none"], (0,), "unknown experiment"), (["mqar/softmax"], (), "seeds"), (["mqar/softmax"], (-1,), "seed"),
])
def test_bad_arguments_raise(tmp_path, fake, keys, seeds, match):
    api = fake(FakeAPI())
    with pytest.raises(ArgumentError, match=match):
        _tour(tmp_path, keys=keys, seeds=seeds)
    assert api.calls == []


def test_progress_gives_each_run_a_step_callback(tmp_path, fake):
    pytest.importorskip("tqdm")
    api = fake(FakeAPI())
    _tour(tmp_path, keys=["mqar/softmax"], seeds=(0,), progress=True)
    assert len(api.progress_seen) == 1 and callable(api.progress_seen[0])


def test_scaling_is_measured_once_and_cached(tmp_path, fake, monkeypatch):
    calls = []

    from attnkit.lab.analysis.scaling import ScalingRow, ScalingTable
    from attnkit.lab.tour.report import scaling as report_scaling

    rows = (ScalingRow("dense", 256, 1e-3, 1e-4, 2**20), ScalingRow("dense", 512, 4e-3, 2e-4, 2**22))

    def scaling(names, lengths, **kw):
        calls.append((list(names), list(lengths), kw.get("repeats"), kw.get("threads")))
        return ScalingTable(rows, (256, 512))

    monkeypatch.setitem(sys.modules, "attnkit.lab.analysis.scaling", types.SimpleNamespace(scaling=scaling))
    fake(FakeAPI())
    _tour(tmp_path, keys=["mqar/softmax"], seeds=(0,), scaling=None)
    _tour(tmp_path, keys=["mqar/softmax"], seeds=(0,), scaling=None)
    assert calls == [(["dense", "scaled-dot-product"], list(report_scaling.SCALING_LENGTHS), report_scaling.REPEATS, 1)]
    assert report_scaling.REPEATS >= 3  # a median and a spread, not one sample
    data = json.loads((tmp_path / "runs" / "default" / "scaling.json").read_text())
    assert data["status"] == "ok" and data["series"]["dense"][1] == [512, 4e-3, 2**22]
    assert data["points"]["dense"][0] == [256, 1e-3, 1e-4, 2**20, "ok"]
    _tour(tmp_path, keys=["mqar/softmax"], seeds=(0,), quick=True, scaling=None)
    assert len(calls) == 1  # the quick mode measures nothing


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_train_that_many_runs_at_once(tmp_path, fake, monkeypatch, workers):
    """Each run waits until ``workers`` runs are in flight: with two workers all meet, one at a time none does."""
    fake(FakeAPI())
    meeting = threading.Barrier(2, timeout=5)

    def in_child(key, seed, quick, step, device="cpu", threads=None, lr_scale=1.0):
        meeting.wait()  # raises BrokenBarrierError when no second run arrives: a failed run
        return {**runner._as_dict(make_result(key, seed)), "peak_bytes": 1}

    monkeypatch.setattr(runner, "_run_in_child", in_child)
    summary = _tour(tmp_path, keys=["mqar/linear", "mqar/softmax"], seeds=(0,), isolate=True, workers=workers)
    assert (len(summary.ran), len(summary.failed)) == ((2, 0) if workers == 2 else (0, 2))


@pytest.mark.parametrize(("cores", "workers", "each"), [(2, 2, 1), (2, 1, 2), (8, 2, 4), (1, 2, 1)])
def test_the_runs_trained_at_once_share_the_threads_and_never_oversubscribe(tmp_path, fake, monkeypatch, cores,
                                                                            workers, each):
    fake(FakeAPI())
    jobs = []

    def child(job, step, on_result=None):
        jobs.append(job)
        return [{**runner._as_dict(make_result(job["key"], job["seed"])), "peak_bytes": 1}]

    monkeypatch.setattr(runner, "run_child", child)
    before = torch.get_num_threads()
    torch.set_num_threads(cores)
    try:
        _tour(tmp_path, keys=["mqar/linear", "mqar/softmax"], seeds=(0,), isolate=True, workers=workers)
    finally:
        torch.set_num_threads(before)
    assert len(jobs) == 2 and all(job["threads"] == each for job in jobs)
    assert workers * each <= max(cores, workers)


def test_a_swept_run_tells_its_process_the_rate_and_a_plain_one_does_not(tmp_path, fake, monkeypatch):
    fake(FakeAPI())
    jobs = []

    def child(job, step, on_result=None):
        jobs.append(job)
        return [{**runner._as_dict(make_result(job["key"], job["seed"])), "peak_bytes": 1}]

    monkeypatch.setattr(runner, "run_child", child)
    _tour(tmp_path / "plain", keys=["mqar/linear"], seeds=(0,), isolate=True, workers=1)
    _tour(tmp_path / "sweep", keys=["mqar/linear"], seeds=(0,), isolate=True, workers=1, lr_sweep=True)
    assert "lr_scale" not in jobs[0] and sorted(job.get("lr_scale", 1.0) for job in jobs[1:]) == [1 / 3, 1.0, 3.0]


class SweepAPI(FakeAPI):
    """A FakeAPI whose runs know the learning-rate factor: mqar/linear is best at 3x, the others at 1x."""

    def run(self, key, seed, *, quick=False, progress=None, lr_scale=1.0):
        self.calls.append((key, seed, quick, lr_scale))
        result = make_result(key, seed)
        bonus = 0.5 if key == "mqar/linear" and lr_scale == 3.0 else (0.0 if lr_scale == 1.0 else -0.2)
        return FakeResult(**{**result.__dict__, "accuracy": result.accuracy + bonus})


def test_lr_sweep_trains_every_run_at_three_rates_and_the_report_reads_the_best(tmp_path, fake):
    from attnkit.lab.tour import report

    api = fake(SweepAPI())
    summary = _tour(tmp_path, keys=["mqar/softmax", "mqar/linear"], seeds=(0, 1), lr_sweep=True)
    assert sorted(api.calls) == sorted((k, s, False, f) for k in ("mqar/softmax", "mqar/linear") for s in (0, 1)
                                       for f in store.LR_SWEEP)
    assert len(summary.ran) == 12 and "mqar/linear at lr x3 seed 1" in summary.ran
    saved = json.loads((tmp_path / "runs" / "default" / "mqar__linear__lr3__seed1.json").read_text())
    assert saved["lr_scale"] == 3.0 and saved["result"]["accuracy"] == 0.5 + 0.5
    assert store.load_manifest(tmp_path)["lr_scales"] == list(store.LR_SWEEP)
    rows = {r.key: r for r in report.load(tmp_path).rows}
    assert rows["mqar/linear"].lr_scale == 3.0 and rows["mqar/linear"].accuracy[0] == 0.4 + 0.5
    assert rows["mqar/softmax"].lr_scale == 1.0 and rows["mqar/softmax"].accuracy[0] == (0.9 + 0.8) / 2
    table = report.table_rows(list(rows.values()))
    assert table[0][3] == "best learning rate" and table[2][3] == "(x3 of 0.333, 1, 3)"  # the fake has no budget
    again = fake(SweepAPI())
    _tour(tmp_path, keys=["mqar/softmax", "mqar/linear"], seeds=(0, 1), lr_sweep=True)
    assert again.calls == []  # every rate's runs are reused


def test_without_lr_sweep_nothing_changes_and_a_later_sweep_reuses_those_runs(tmp_path, fake):
    from attnkit.lab.tour import report

    api = fake(FakeAPI())  # knows no learning-rate factor: a plain tour never passes one
    _tour(tmp_path, keys=["mqar/linear"], seeds=(0,))
    assert api.calls == [("mqar/linear", 0, False)]
    assert sorted(p.name for p in (tmp_path / "runs" / "default").iterdir()) == ["mqar__linear__seed0.json"]
    assert "lr_scales" not in store.load_manifest(tmp_path)
    assert report.table_rows(report.load(tmp_path).rows)[0][3] == "seeds"  # no rate column
    sweep = fake(SweepAPI())
    summary = _tour(tmp_path, keys=["mqar/linear"], seeds=(0,), lr_sweep=True)
    assert sorted(f for *_, f in sweep.calls) == [1 / 3, 3.0] and summary.cached == ["mqar/linear seed 0"]
