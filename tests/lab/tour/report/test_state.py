"""The report's state-tracking section: runs by task and mechanism, the claim by Welch's t, table and picture."""

from attnkit.lab.tour import report
from attnkit.lab.tour.experiments.state import BANDS, CLAIM
from attnkit.lab.tour.report.state import claim_verdict, state_html, state_markdown, state_runs


def _records(accuracy: dict[tuple[str, str], list[float]]) -> list[dict]:
    return [{"key": f"{t}/{m}", "task": t, "mechanism": m, "seed": seed, "status": "ok",
             "result": {"accuracy": a, "extra": {f"length_{end}": a for end in BANDS}}}
            for (t, m), accs in accuracy.items() for seed, a in enumerate(accs)]


def _report(tmp_path, accuracy) -> report.Report:
    records = _records(accuracy) + [{"key": "mqar/softmax", "task": "mqar", "mechanism": "softmax", "seed": 0,
                                     "status": "ok", "result": {"accuracy": 1.0}}]
    return report.Report(tmp_path, None, records, report.summarize(records), [], None)


HELD = {("parity", "deltanet"): [0.50, 0.52, 0.49], ("parity", "deltanet-neg"): [0.99, 0.97, 0.98],
        ("parity", "lstm"): [1.0, 1.0, 1.0]}


def test_runs_are_grouped_by_task_and_mechanism_in_tour_order(tmp_path):
    runs = state_runs(_report(tmp_path, HELD))
    assert list(runs) == [("parity", "deltanet"), ("parity", "deltanet-neg"), ("parity", "lstm")]
    assert runs[("parity", "deltanet-neg")][1]["accuracy"] == 0.97


def test_the_claim_needs_both_halves(tmp_path):
    assert (CLAIM["solves"], CLAIM["fails"], CLAIM["level"]) == ("deltanet-neg", "deltanet", 0.9)
    result, detail = claim_verdict(state_runs(_report(tmp_path, HELD)))
    assert result == "held" and "minus 90 %" in detail and "60 % (chance + 10)" in detail
    low = {**HELD, ("parity", "deltanet-neg"): [0.70, 0.72, 0.71]}
    assert claim_verdict(state_runs(_report(tmp_path, low)))[0] == "did not hold"
    learns = {**HELD, ("parity", "deltanet"): [0.80, 0.85, 0.9]}
    assert claim_verdict(state_runs(_report(tmp_path, learns)))[0] == "did not hold"
    noisy = {**HELD, ("parity", "deltanet-neg"): [0.99, 0.60, 0.98]}
    assert claim_verdict(state_runs(_report(tmp_path, noisy)))[0] == "undecided"
    one = {("parity", "deltanet"): [0.5], ("parity", "deltanet-neg"): [1.0, 1.0]}
    assert claim_verdict(state_runs(_report(tmp_path, one)))[0] == "not measured"


def test_the_section_shows_table_claim_and_picture_and_is_absent_without_runs(tmp_path):
    rep = _report(tmp_path, HELD)
    text = "\n".join(state_markdown(rep))
    assert "## State tracking against test length" in text and "**held**" in text
    assert "| parity | deltanet-neg | 98.0 ± 1.0 | 3 |" in text
    notes = []
    parts = state_html(rep, notes, lambda rows: f"<table>{len(rows)}</table>", lambda path, alt: f"<img {path}>")
    assert notes == [] and (tmp_path / "img" / "state_tracking.png").is_file() and "<table>4</table>" in parts
    empty = _report(tmp_path, {})
    assert state_markdown(empty) == [] and state_html(empty, [], str, str) == []
