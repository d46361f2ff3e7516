"""The run store both tours share (src/attnkit/tour/store.py): atomic files, saved runs, folders in the way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnkit.errors import ArgumentError
from attnkit.lab.tour import store

ROOT = Path(__file__).resolve().parents[3]


def test_a_run_record_round_trips_and_is_reused_only_for_its_mode_and_version(tmp_path):
    record = {**store.new_record("mqar", "linear", 2, "quick", "v1"), "result": {"accuracy": 0.5}}
    path = store.write_json(store.run_path(tmp_path, "mqar", "linear", 2, "quick"), record)
    assert path == tmp_path / "runs" / "quick" / "mqar__linear__seed2.json"
    assert store.load_run(path) == record and record["key"] == "mqar/linear" and record["format"] == store.FORMAT
    assert store.load_run(path, mode="default") is None and store.load_run(path, version="v2") is None
    assert store.cached(tmp_path, "mqar", "linear", 2, "quick", "v1")
    assert not store.cached(tmp_path, "mqar", "linear", 2, "quick", "v2")
    store.write_json(path, {**record, "status": "failed"})
    assert not store.cached(tmp_path, "mqar", "linear", 2, "quick", "v1")  # a failed run is run again


@pytest.mark.parametrize("text", ["{", "[]", json.dumps({"format": 99, "key": "a"}), json.dumps({"format": 1})])
def test_what_is_not_a_run_of_this_format_reads_as_none(tmp_path, text):
    path = tmp_path / "r.json"
    path.write_text(text)
    assert store.load_run(path) is None
    assert store.load_run(tmp_path / "missing.json") is None


def test_a_folder_or_a_file_in_the_way_is_one_clear_error(tmp_path):
    (tmp_path / "runs" / "quick" / "a.json").mkdir(parents=True)
    with pytest.raises(ArgumentError, match="a folder is in the way"):
        store.write_json(tmp_path / "runs" / "quick" / "a.json", {})
    (tmp_path / "file").write_text("x")
    with pytest.raises(ArgumentError, match="is a file, not a folder"):
        store.check_writable(tmp_path / "file" / "runs" / "b.json")
    assert sorted(p.name for p in (tmp_path / "runs" / "quick").iterdir()) == ["a.json"]  # no temporary file left


def test_the_manifest_names_the_invocation_and_its_end(tmp_path):
    manifest = store.start_manifest(tmp_path, mode="default", keys=["t/m"], seeds=[0], version="v", command="c",
                                    suite="long")
    assert store.load_manifest(tmp_path)["seconds"] is None and manifest["suite"] == "long"
    store.finish_manifest(tmp_path, manifest, 12.5)
    saved = store.load_manifest(tmp_path)
    assert saved["seconds"] == 12.5 and saved["machine"]["cpus"] and saved["keys"] == ["t/m"]


def test_the_records_of_the_last_invocation_are_its_keys_seeds_and_version(tmp_path):
    for seed, version in ((0, "v"), (1, "v"), (2, "old")):
        rec = {**store.new_record("t", "m", seed, "default", version), "result": {"accuracy": 1.0}}
        store.write_json(store.run_path(tmp_path, "t", "m", seed, "default"), rec)
    store.start_manifest(tmp_path, mode="default", keys=["t/m"], seeds=[0, 2], version="v", command="c")
    assert [r["seed"] for r in store.load_records(tmp_path)] == [0]


def test_the_version_hashes_names_and_bytes(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    first = store.source_version([a, b])
    assert first == store.source_version([b, a]) and first.split("+")[0] == store.__version__
    b.write_text("y = 3\n")
    assert store.source_version([a, b]) != first


@pytest.mark.parametrize("folder", ["tour", "tour-long"])
def test_a_committed_report_folder_holds_exactly_the_runs_its_report_reads(folder):
    from attnkit.lab.tour.long.runner import load_speed

    out = ROOT / "docs" / folder
    manifest = store.load_manifest(out)
    mode = manifest["mode"]
    read = {store.run_path(out, r["task"], r["mechanism"], r["seed"], mode) for r in store.load_records(out, manifest)}
    read |= {p for p in (out / "runs" / mode).glob("speed__*.json")
             if (load_speed(p, scale=mode, version=manifest["version"]) or {}).get("status") == "ok"}
    read |= {p for p in [out / "runs" / mode / "scaling.json"] if p.exists()}  # the default tour's scaling plot
    held = {p for p in (out / "runs").rglob("*") if p.is_file()}
    assert read and held == read, sorted(p.name for p in held ^ read)[:10]


def test_the_learning_rate_factor_is_part_of_a_runs_key_and_factor_1_keeps_the_plain_name(tmp_path):
    plain, third, triple = (store.run_path(tmp_path, "mqar", "gla", 0, "default", f) for f in (1.0, 1 / 3, 3.0))
    assert plain == store.run_path(tmp_path, "mqar", "gla", 0, "default")
    assert plain.name == "mqar__gla__seed0.json" and third.name == "mqar__gla__lr0.333__seed0.json"
    assert triple.name == "mqar__gla__lr3__seed0.json"
    record = {**store.new_record("mqar", "gla", 0, "default", "v", lr_scale=3.0, lr=0.009), "result": {"accuracy": 1}}
    store.write_json(triple, record)
    assert store.cached(tmp_path, "mqar", "gla", 0, "default", "v", 3.0)
    assert not store.cached(tmp_path, "mqar", "gla", 0, "default", "v")  # another rate is another run
    assert store.load_run(triple)["lr_scale"] == 3.0 and store.load_run(triple)["lr"] == 0.009


def _rate_runs(out, accuracies, version="v"):
    """Save one run per (factor, seed) of t/m with the given accuracies (None: a failed run)."""
    for factor, accs in accuracies.items():
        for seed, acc in enumerate(accs):
            rec = store.new_record("t", "m", seed, "default", version, lr_scale=factor, lr=0.003 * factor)
            rec = {**rec, "result": {"accuracy": acc}} if acc is not None else {**rec, "status": "failed"}
            store.write_json(store.run_path(out, "t", "m", seed, "default", factor), rec)


def test_the_best_rate_is_the_factor_with_the_best_mean_accuracy_over_seeds(tmp_path):
    # factor 3 has the best single seed (0.99), factor 1/3 the best mean: the mean decides
    _rate_runs(tmp_path, {1 / 3: [0.8, 0.8, 0.8], 1.0: [0.5, 0.6, 0.7], 3.0: [0.99, 0.1, 0.1]})
    store.start_manifest(tmp_path, mode="default", keys=["t/m"], seeds=[0, 1, 2], version="v", command="c",
                         lr_scales=list(store.LR_SWEEP))
    records = store.load_records(tmp_path)
    assert [(r["lr_scale"], r["seed"]) for r in records] == [(1 / 3, 0), (1 / 3, 1), (1 / 3, 2)]
    assert all(r["lr_swept"] == [1 / 3, 1.0, 3.0] for r in records)
    assert len(store.load_records(tmp_path, every_rate=True)) == 9


def test_a_rate_whose_runs_all_failed_is_never_the_best_and_ties_go_to_the_own_rate():
    def rec(factor, seed, acc):
        base = store.new_record("t", "m", seed, "default", "v", lr_scale=factor)
        return {**base, "result": {"accuracy": acc}} if acc is not None else {**base, "status": "failed"}

    failed_high = [rec(3.0, 0, None), rec(1.0, 0, 0.2), rec(1 / 3, 0, 0.1)]
    assert [r["lr_scale"] for r in store.best_rates(failed_high)] == [1.0]
    tie = [rec(3.0, 0, 0.5), rec(1.0, 0, 0.5), rec(1 / 3, 0, 0.5)]
    assert [r["lr_scale"] for r in store.best_rates(tie)] == [1.0]
    one_rate = [rec(1.0, 0, 0.5), rec(1.0, 1, 0.7)]
    assert store.best_rates(one_rate) == one_rate  # without a sweep, the records come back as they were


def test_without_a_sweep_the_report_reads_the_plain_runs_only(tmp_path):
    _rate_runs(tmp_path, {1.0: [0.5, 0.6], 3.0: [0.9, 0.9]})
    store.start_manifest(tmp_path, mode="default", keys=["t/m"], seeds=[0, 1], version="v", command="c")
    records = store.load_records(tmp_path)
    assert [(r["lr_scale"], r["result"]["accuracy"]) for r in records] == [(1.0, 0.5), (1.0, 0.6)]
    assert all("lr_swept" not in r for r in records)
    (tmp_path / "tour.json").unlink()  # a folder without a manifest: the plain runs too
    assert [r["lr_scale"] for r in store.load_records(tmp_path)] == [1.0, 1.0]


def test_runs_saved_before_rates_were_recorded_read_as_the_own_rate(tmp_path):
    rec = {**store.new_record("t", "m", 0, "default", "v"), "result": {"accuracy": 0.4}}
    del rec["lr_scale"], rec["lr"]  # a committed run of an earlier version
    store.write_json(store.run_path(tmp_path, "t", "m", 0, "default"), rec)
    store.start_manifest(tmp_path, mode="default", keys=["t/m"], seeds=[0], version="v", command="c")
    assert [r["result"]["accuracy"] for r in store.load_records(tmp_path)] == [0.4]
    assert store.cached(tmp_path, "t", "m", 0, "default", "v", 1.0)
