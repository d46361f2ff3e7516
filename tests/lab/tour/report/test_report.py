"""The tour report: the table's statistics, a parseable Markdown table, failures shown, an offline HTML page."""

from __future__ import annotations

import argparse
import json
import math
import re

import pytest

from attnkit.errors import ArgumentError
from attnkit.lab.commands import tour as tour_command
from attnkit.lab.tour import report, runner, store
from tests.lab.tour.test_runner import ACCURACY, EXPERIMENTS, FakeAPI, fake  # noqa: F401  (fake is a fixture)


def _tour(out, **kw):
    return runner.tour(out=out, progress=False, scaling=False, isolate=False, **kw)  # the fakes live here


def _split(line: str) -> list[str]:
    """Cells of a Markdown table line; ``\\|`` is a pipe inside a cell."""
    cells = re.split(r"(?<!\\)\|", line.strip())
    assert cells[0] == "" and cells[-1] == "", line
    return [c.strip().replace("\\|", "|") for c in cells[1:-1]]


def _parse(table: str) -> list[dict[str, str]]:
    lines = table.strip().splitlines()
    header = _split(lines[0])
    assert all(set(c) <= {"-", ":"} and c for c in _split(lines[1]))
    rows = [_split(line) for line in lines[2:]]
    assert all(len(r) == len(header) for r in rows)
    return [dict(zip(header, r, strict=True)) for r in rows]


def _stats(values):
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def test_table_mean_and_sample_std_over_seeds(tmp_path, fake):  # noqa: F811
    fake(FakeAPI())
    _tour(tmp_path)
    rows = {r.key: r for r in report.summarize(report.load_records(tmp_path))}
    for key in EXPERIMENTS:
        mean, std = _stats([ACCURACY[key, s] for s in (0, 1, 2)])
        assert rows[key].accuracy[0] == pytest.approx(mean, abs=1e-12)
        assert rows[key].accuracy[1] == pytest.approx(std, abs=1e-12)
        assert rows[key].train_seconds == pytest.approx(2.0)  # 1 + seed over seeds 0, 1, 2
        assert rows[key].peak_bytes is None  # trained in this process: memory not measured, not a false 0
        assert rows[key].extra["attention_on_key"][0] == pytest.approx(0.6)
    table = {r["mechanism"]: r for r in _parse(report.markdown_table(tmp_path))}
    assert table["softmax"]["accuracy % (mean ± std)"] == "90.0 ± 10.0"
    assert table["linear"]["accuracy % (mean ± std)"] == "40.0 ± 10.0"
    assert table["additive"]["accuracy % (mean ± std)"] == "98.0 ± 1.0"
    assert table["softmax"]["seeds"] == "3" and table["softmax"]["train time s"] == "2.0"
    assert table["softmax"]["peak memory MiB"] == "-" and table["softmax"]["parameters"] == "1,234"


def test_peak_memory_is_the_mean_over_seeds_of_the_runs_that_measured_it(tmp_path, fake):  # noqa: F811
    fake(FakeAPI())
    _tour(tmp_path)
    records = report.load_records(tmp_path)
    for r in records:  # as each run's fresh process would have measured it (runner.tour's default)
        r["result"]["peak_bytes"] = (r["seed"] + 1) * 2**20 if r["seed"] < 2 else None
    rows = {r.key: r for r in report.summarize(records)}
    assert all(rows[key].peak_bytes == pytest.approx(1.5 * 2**20) for key in EXPERIMENTS)


def test_readme_holds_the_same_parseable_table_and_how_it_was_run(tmp_path, fake):  # noqa: F811
    fake(FakeAPI())
    _tour(tmp_path, seeds=(0, 1), command="attnkit tour --seeds 0 1")
    md_path, _ = report.write(tmp_path)
    text = md_path.read_text()
    table = report.markdown_table(tmp_path)
    assert table in text
    parsed = _parse(table)
    assert [(r["task"], r["mechanism"]) for r in parsed] == [(e.task, e.mechanism) for e in EXPERIMENTS.values()]
    for needle in ("attnkit tour --seeds 0 1", "torch", "## What each task tests", "**mqar**", "**dates**",
                   "attention_on_key", "## How it was run", "## Registry entries the tour leaves out", "**alibi**"):
        assert needle in text


def test_a_single_seed_has_no_std_and_pipes_are_escaped():
    rec = {"key": "t/a|b", "task": "t", "mechanism": "a|b", "seed": 0, "status": "ok",
           "result": {"accuracy": 0.25, "train_seconds": 3.0, "peak_bytes": None, "parameters": 7}}
    table = report.markdown_table(report.summarize([rec]))
    (row,) = _parse(table)
    assert row["mechanism"] == "a|b" and row["accuracy % (mean ± std)"] == "25.0"
    assert row["peak memory MiB"] == "-" and row["parameters"] == "7"


def test_failed_runs_are_counted_and_reported(tmp_path, fake):  # noqa: F811
    fake(FakeAPI(fail={"mqar/linear"}))
    _tour(tmp_path, seeds=(0, 1))
    md_path, html_path = report.write(tmp_path)
    row = {r["mechanism"]: r for r in _parse(report.markdown_table(tmp_path))}["linear"]
    assert row["accuracy % (mean ± std)"] == "failed" and row["seeds"] == "0 (2 failed)"
    for text in (md_path.read_text(), html_path.read_text()):
        assert "Failed runs" in text and "RuntimeError: boom in mqar/linear" in text
    assert '<td class="failed">failed</td>' in html_path.read_text()


def test_a_stale_run_of_another_code_version_is_not_mixed_in(tmp_path, fake, monkeypatch):  # noqa: F811
    fake(FakeAPI())
    _tour(tmp_path, keys=["mqar/softmax"], seeds=(0, 1))
    monkeypatch.setattr(runner, "code_version", lambda: "9.9.9+new")
    _tour(tmp_path, keys=["mqar/softmax"], seeds=(0,))  # seed 1 stays on disk from the old version
    records = report.load_records(tmp_path)
    assert [(r["seed"], r["version"]) for r in records] == [(0, "9.9.9+new")]


def test_html_is_self_contained_with_pictures_and_map_pages(tmp_path, fake):  # noqa: F811
    pytest.importorskip("matplotlib")
    fake(FakeAPI())
    _tour(tmp_path, seeds=(0, 1))
    _, html_path = report.write(tmp_path)
    page = html_path.read_text()
    pages = sorted((tmp_path / "maps").glob("*.html"))
    assert [p.name for p in pages] == ["dates-additive.html", "mqar-linear.html", "mqar-softmax.html"]
    external = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)
    for text in [page] + [p.read_text() for p in pages]:
        assert not external.search(text)
        assert not re.search(r"<(?:script|link)[^>]+(?:src|href)=", text)  # no external script or style sheet
    srcs = re.findall(r'<img[^>]+src="([^"]+)"', page)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert 'href="maps/mqar-softmax.html"' in page
    assert (tmp_path / "img" / "curves__mqar.png").exists() and (tmp_path / "img" / "cost.png").exists()
    assert "Pictures not drawn" not in page
    assert "scaled-dot-product" in page and "linear-attention" in page  # analytic cost of the tour's mechanisms


def test_report_shows_measured_scaling_from_its_cache(tmp_path, fake):  # noqa: F811
    pytest.importorskip("matplotlib")
    fake(FakeAPI())
    _tour(tmp_path, keys=["mqar/softmax"], seeds=(0,))
    store.write_json(tmp_path / "runs" / "default" / "scaling.json", {
        "status": "ok", "series": {"dense": [[256, 1e-3, 2**20], [512, 4e-3, 2**22]]},
        "points": {"dense": [[256, 1e-3, 2e-4, 2**20, "ok"], [512, 4e-3, 4e-4, 2**22, "ok"]]},
        "lengths": [256, 512], "repeats": 3, "threads": 1, "sizes": {"heads": 4}, "seconds": 3.0})
    md_path, html_path = report.write(tmp_path)
    assert "| dense | 1.0 ± 0.1 | 4.0 ± 0.2 | 1.0 | 4.0 | 2.00 | 2.00 |" in md_path.read_text()
    assert (tmp_path / "img" / "scaling.png").exists() and "measured scaling" in html_path.read_text()


def _command(argv):
    parser = argparse.ArgumentParser(prog="attnkit")
    tour_command.add(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["tour", *argv, "--in-process"])  # the fake experiments live in this process
    args.argv = ["tour", *argv]
    return args.func(args)


def test_command_list_and_run(tmp_path, fake, capsys):  # noqa: F811
    api = fake(FakeAPI())
    assert _command(["--list"]) == 0
    listing = capsys.readouterr().out
    assert all(key in listing for key in EXPERIMENTS) and "3 experiments" in listing and api.calls == []
    out = tmp_path / "rep"
    argv = ["--quick", "--out", str(out), "--tasks", "mqar", "--mechanisms", "linear", "--seeds", "0", "1",
            "--threads", "1", "--no-progress"]
    assert _command(argv) == 0
    assert api.calls == [("mqar/linear", 0, True), ("mqar/linear", 1, True)]
    printed = capsys.readouterr().out
    assert str(out / "README.md") in printed and str(out / "index.html") in printed
    assert "attnkit tour --quick" in (out / "README.md").read_text()


def test_command_rejects_unknown_task_and_reports_failures(tmp_path, fake, capsys):  # noqa: F811
    fake(FakeAPI(fail={"dates/additive"}))
    with pytest.raises(ArgumentError, match="unknown 'nope'"):
        _command(["--tasks", "nope", "--out", str(tmp_path)])
    with pytest.raises(ArgumentError, match=r"--tasks: unknown 'mqr'; did you mean 'mqar'\?"):
        _command(["--tasks", "mqr", "--out", str(tmp_path)])
    argv = ["--quick", "--out", str(tmp_path), "--tasks", "dates", "--seeds", "0", "--threads", "1", "--no-progress"]
    assert _command(argv) == 1
    assert "failed: dates/additive seed 0" in capsys.readouterr().out
    assert json.loads((tmp_path / "tour.json").read_text())["keys"] == ["dates/additive"]
