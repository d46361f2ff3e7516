"""The report's MAD section: scores by mechanism and task, the mean over the six, the claim, the heat map."""

from attnkit.lab.tasks.mad import MAD_TASKS
from attnkit.lab.tour import report
from attnkit.lab.tour.experiments.mad import CLAIM
from attnkit.lab.tour.report.mad import claim_verdict, mad_html, mad_markdown, mad_scores, mad_table


def _report(tmp_path, accuracy: dict[tuple[str, str], list[float]]) -> report.Report:
    records = [{"key": f"{t}/{m}", "task": t, "mechanism": m, "seed": seed, "status": "ok",
                "result": {"accuracy": a}} for (t, m), accs in accuracy.items() for seed, a in enumerate(accs)]
    records.append({"key": "mqar/softmax", "task": "mqar", "mechanism": "softmax", "seed": 0, "status": "ok",
                    "result": {"accuracy": 1.0}})
    return report.Report(tmp_path, None, records, report.summarize(records), [], None)


FULL = {**{(t, "linear"): [0.5, 0.7] for t in MAD_TASKS}, **{(t, "softmax"): [1.0, 0.9] for t in MAD_TASKS}}


def test_scores_come_in_roster_order_and_the_mean_needs_all_six_tasks(tmp_path):
    scores = mad_scores(_report(tmp_path, FULL))
    assert list(scores) == ["softmax", "linear"] and scores["linear"]["compression"] == [0.5, 0.7]
    rows = mad_table(scores)
    assert rows[0] == ["mechanism", *MAD_TASKS, "mean", "seeds"]
    assert rows[1] == ["softmax", *["95.0"] * 6, "95.0", "2"] and rows[2][-2] == "60.0"
    part = mad_table(mad_scores(_report(tmp_path, {("compression", "gla"): [0.4]})))
    assert part[1][5] == "40.0" and part[1][-2] == "-" and part[1][1] == "-"


def test_the_claim_is_softmax_on_in_context_recall_against_ninety_percent(tmp_path):
    assert (CLAIM["task"], CLAIM["mechanism"], CLAIM["level"]) == ("in_context_recall", "softmax", 0.9)
    held = {("in_context_recall", "softmax"): [0.99, 0.98, 1.0]}
    assert claim_verdict(mad_scores(_report(tmp_path, held)))[0] == "held"
    low = {("in_context_recall", "softmax"): [0.5, 0.52, 0.49]}
    assert claim_verdict(mad_scores(_report(tmp_path, low)))[0] == "did not hold"
    one = claim_verdict(mad_scores(_report(tmp_path, {("in_context_recall", "softmax"): [0.95]})))
    assert one[0] == "held on one seed" and "95.0 % on one seed" in one[1] and "no interval" in one[1]
    low_one = {("in_context_recall", "softmax"): [0.3]}
    assert claim_verdict(mad_scores(_report(tmp_path, low_one)))[0] == "did not hold on one seed"
    assert claim_verdict(mad_scores(_report(tmp_path, {("compression", "softmax"): [1.0]})))[0] == "not measured"


def test_the_section_has_table_claim_and_heat_map_and_is_absent_without_runs(tmp_path):
    rep = _report(tmp_path, FULL)
    text = "\n".join(mad_markdown(rep))
    assert "## MAD" in text and "| softmax | 95.0 |" in text and "**held**" not in text  # 2 seeds of 1.0, 0.9
    notes = []
    parts = mad_html(rep, notes, lambda rows: f"<table>{len(rows)}</table>", lambda path, alt: f"<img {path}>")
    assert notes == [] and (tmp_path / "img" / "mad.png").is_file() and "<table>3</table>" in parts
    assert mad_markdown(_report(tmp_path, {})) == [] and "One seed" not in text


def test_one_seed_is_said_in_the_section(tmp_path):
    rep = _report(tmp_path, {(t, "softmax"): [1.0] for t in MAD_TASKS})
    text = "\n".join(mad_markdown(rep))
    assert "One seed per run" in text and "**held on one seed**" in text
    parts = mad_html(rep, [], lambda rows: "<table></table>", lambda path, alt: "<img>")
    assert any("One seed per run" in part for part in parts)
