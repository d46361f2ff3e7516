"""The benchmark suite (benchmarks/suite.py, benchmarks/run.py): every target covered, rows cached, failures reported.

Tiny sizes only and no timed assertion: every check is about structure or values.
"""

from __future__ import annotations

import functools
import importlib
import json
import shlex
from pathlib import Path

import pytest

from attnkit.lab import cli
from attnkit.lab.benchmarking.rows import Row, Spec
from tests.benchmarks.helpers import render_suite as _render
from tests.lab.benchmarking.helpers import tiny as _tiny

ROOT = Path(__file__).resolve().parents[2]


def _suite_module(name):
    return importlib.import_module(f"benchmarks.{name}")


def test_suite_covers_every_target_with_unique_reproducible_specs():
    suite = _suite_module("suite")
    parser = cli.build_parser()
    for quick in (True, False):
        specs = suite.specs(quick)
        assert {s.target for s in specs} == {1, 2, 3, 4, 5, 6}
        assert len({s.key for s in specs}) == len(specs)
        for spec in specs:
            assert Spec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
            args = parser.parse_args(shlex.split(suite.bench_command(spec))[1:])
            assert args.compare == spec.compare and args.q_len == spec.case.q_len
            assert args.mask == spec.case.mask and args.bias == spec.case.bias and args.dtype == spec.case.dtype
    huge = [s for s in suite.specs(False) if s.case.q_len == 16384]
    assert huge and all(s.repeats <= 2 for s in huge)  # the dense-mask baseline costs tens of seconds there


def test_suite_caches_each_spec_and_resumes(tmp_path, monkeypatch):
    run = _suite_module("run")
    calls = []

    def fake_run_spec(spec, **kw):
        calls.append(spec.key)
        return [Row(spec.target, spec.label, "s", "fwd", "a", "b", 1, [1.0, 1.0, 1.0], gflops=2.0)]
    monkeypatch.setattr(run, "run_spec", fake_run_spec)
    specs = [Spec(1, "x", _tiny(), ("sdpa-mask",)), Spec(2, "y", _tiny(backward=True), ("sdpa-mask",))]
    measure = functools.partial(run.measure, isolated=False)  # the fake run_spec lives in this process
    first = measure(specs, tmp_path, fresh=False, only=None, ceil={"float32": 4.0})
    assert len(calls) == 2 and sorted(p.stem for p in tmp_path.glob("*.json")) == sorted(s.key for s in specs)
    again = measure(specs, tmp_path, fresh=False, only=None, ceil={"float32": 4.0})
    assert len(calls) == 2 and [r.__dict__ for r in again] == [r.__dict__ for r in first]
    assert again[0].ceiling_frac == 0.5
    measure(specs, tmp_path, fresh=True, only={2}, ceil={})
    assert calls[2:] == [specs[1].key]
    monkeypatch.setattr(run, "code_version", lambda: "another commit")
    measure(specs, tmp_path, fresh=False, only=None, ceil={})
    assert len(calls) == 5  # rows measured with other code are stale


def test_a_failing_row_is_reported_and_not_cached(tmp_path, monkeypatch):
    run = _suite_module("run")

    def broken(spec, **kw):
        raise TypeError("a kernel broke")
    monkeypatch.setattr(run, "run_spec", broken)
    spec = Spec(4, "softcap", _tiny(bias="softcap", mask=None), ("eager",))
    (row,) = run.measure([spec], tmp_path, fresh=False, only=None, ceil={}, isolated=False)
    assert row.verdict == "ERROR" and "TypeError: a kernel broke" in row.notes["error"]
    assert not list(tmp_path.glob("*.json"))
    assert "failed: TypeError: a kernel broke" in _render([row])


def test_isolated_rows_come_from_a_child_process(tmp_path, monkeypatch):
    """A spec measured in a fresh child: the same rows as in process; a child's failure is an ERROR row."""
    run = _suite_module("run")
    spec = Spec(1, "tiny", _tiny(), ("sdpa-mask",), repeats=1)
    monkeypatch.setattr(run, "run_spec", lambda *a, **kw: pytest.fail("measured in the parent process"))
    (row,) = run.measure([spec], tmp_path, fresh=True, only=None, ceil={"float32": 4.0})
    assert (row.target, row.label, row.theirs) == (1, "tiny", "torch sdpa (dense bool mask)")
    assert row.verdict != "ERROR" and row.max_diff is not None and row.max_diff < 1e-5 and row.ours_s
    bad = Spec(1, "bad", _tiny(mask="no_such_mask(3)"), ("sdpa-mask",), repeats=1)
    (err,) = run.measure([bad], tmp_path, fresh=True, only=None, ceil={})
    assert err.verdict == "ERROR" and "child measuring 'bad' failed" in err.notes["error"]


@pytest.mark.parametrize("script", ["suite_report", "scaling", "overhead", "ceiling", "whole_models", "compiled",
                                    "transformers_models"])
def test_each_scripts_section_is_in_benchmarks_md_under_its_heading(script):
    """A rewrite replaces the text between the markers; the heading above them is the script's title."""
    from attnkit.lab.benchmarking.sections import markers

    module = _suite_module(script)
    doc = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    start, end = markers(module.NAME)
    assert doc.count(start) == doc.count(end) == 1 and doc.index(start) < doc.index(end)
    assert doc.split(start)[0].rstrip("\n").endswith(f"\n## {module.TITLE}")


def test_no_heading_of_benchmarks_md_names_an_issue():
    headings = [line for line in (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()
                if line.startswith("#")]
    assert headings and not [h for h in headings if "issue" in h.lower()]


def test_main_writes_the_suite_section_and_keeps_every_other_byte(tmp_path, monkeypatch):
    run = _suite_module("run")
    ceil = {dtype: {"1": 1.0, "all": 2.0, "n": 64} for dtype in ("float32", "bfloat16")}
    monkeypatch.setattr(run, "ceiling", lambda n, seconds: ceil)
    monkeypatch.setattr(run, "measure", lambda *args, **kwargs: [])
    monkeypatch.setattr(run, "plots", lambda *args: [])
    out = tmp_path / "BENCHMARKS.md"
    kept = "\n## Written by hand\n\nkept as is\n\n## Scaling\n\n<!-- scaling:start -->\n| s |\n<!-- scaling:end -->\n"
    out.write_text("# Benchmarks\n\n## Benchmark suite\n\n<!-- suite:start -->\nold\n<!-- suite:end -->\n" + kept)
    assert run.main(["--only", "1", "--out", str(out)]) == 0  # target 1 only: no overhead rows
    doc = out.read_text()
    assert doc.endswith(kept) and "\nold\n" not in doc and doc.count("## Benchmark suite") == 1
    assert "<!-- suite:start -->\nEvery ratio is attnkit's median time" in doc
    assert "| float32 | 64 | 1.0 | 2.0 |" in doc and "\n### Misses\n" in doc
