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
