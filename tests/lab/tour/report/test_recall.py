"""The report's recall-against-state section: cells from the runs, the claim by Welch's t, table and picture."""

from __future__ import annotations

import statistics

import pytest

from attnkit.lab.tour import report
from attnkit.lab.tour.experiments.recall import CLAIM, TASK, state_bytes
from attnkit.lab.tour.report.recall import claim_verdict, recall_cells, recall_html, recall_markdown

STATE = {"deltanet": 300.0, "linear": 280.0, "softmax": 1000.0}


def _records(accuracy: dict[tuple[str, int], list[float]]) -> list[dict]:
    return [{"key": f"{TASK}/{m}-d{w}", "task": TASK, "mechanism": f"{m}-d{w}", "seed": seed, "status": "ok",
             "result": {"accuracy": a}}
            for (m, w), accs in accuracy.items() for seed, a in enumerate(accs)]


def _report(tmp_path, accuracy) -> report.Report:
    records = _records(accuracy) + [{"key": "mqar/softmax", "task": "mqar", "mechanism": "softmax", "seed": 0,
                                     "status": "ok", "result": {"accuracy": 1.0}}]
    return report.Report(tmp_path, None, records, report.summarize(records), [], None)


SOLVED = {("linear", 8): [0.30, 0.35, 0.31], ("deltanet", 16): [1.0, 0.98, 0.99], ("deltanet", 8): [0.5, 0.6, 0.4],
          ("linear", 16): [0.33, 0.32, 0.36], ("softmax", 8): [0.9, 1.0, 1.0]}


def _cells(rep):
    return recall_cells(rep, state=lambda mechanism, width: STATE[mechanism] * width)


def test_cells_group_seeds_by_mechanism_and_width_in_the_experiments_order(tmp_path):
    cells = _cells(_report(tmp_path, SOLVED))
    assert [(c.mechanism, c.width) for c in cells] == [("softmax", 8), ("linear", 8), ("linear", 16),
                                                       ("deltanet", 8), ("deltanet", 16)]
    assert cells[3].accuracy == {0: 0.5, 1: 0.6, 2: 0.4} and cells[3].state_bytes == 2400.0


def test_the_claim_compares_each_seeds_mean_over_widths_by_welchs_interval(tmp_path):
    result, w, detail = claim_verdict(_cells(_report(tmp_path, SOLVED)))
    better = [(0.5 + 1.0) / 2, (0.6 + 0.98) / 2, (0.4 + 0.99) / 2]  # deltanet, per seed
    worse = [(0.30 + 0.33) / 2, (0.35 + 0.32) / 2, (0.31 + 0.36) / 2]
    se = (statistics.variance(better) / 3 + statistics.variance(worse) / 3) ** 0.5
    assert (CLAIM["better"], CLAIM["worse"]) == ("deltanet", "linear")
    assert result == "held" and w.difference == pytest.approx(statistics.fmean(better) - statistics.fmean(worse))
    assert w.t == pytest.approx(w.difference / se) and w.low > 0
    assert "widths 8, 16" in detail and f"{100 * w.difference:+.1f} points" in detail
    swapped = {("deltanet" if m == "linear" else "linear", w): a for (m, w), a in SOLVED.items() if m != "softmax"}
    assert claim_verdict(_cells(_report(tmp_path, swapped)))[0] == "did not hold"
    noisy = {("deltanet", 8): [0.9, 0.2, 0.5], ("linear", 8): [0.5, 0.4, 0.45]}
    assert claim_verdict(_cells(_report(tmp_path, noisy)))[0] == "undecided"
    one = {("deltanet", 8): [0.9], ("linear", 8): [0.3, 0.3]}
    assert claim_verdict(_cells(_report(tmp_path, one)))[:2] == ("not measured", None)


def test_the_section_shows_table_claim_and_picture_and_is_absent_without_runs(tmp_path):
    rep = _report(tmp_path, SOLVED)
    text = "\n".join(recall_markdown(rep))
    assert f"| deltanet | 8 | {state_bytes('deltanet', 8):,} | 50.0 ± 10.0 | 3 |" in text and "**held**" in text
    notes: list[str] = []
    parts = recall_html(rep, notes, lambda rows: f"<table>{len(rows)}</table>", lambda path, alt: f"<img {path}>")
    assert notes == [] and (tmp_path / "img" / "recall_state.png").stat().st_size > 1000
    assert "<table>6</table>" in parts and any("<b>held</b>" in p for p in parts)
    empty = report.Report(tmp_path, None, [], [], [], None)
    assert recall_markdown(empty) == [] and recall_html(empty, notes, str, str) == []
