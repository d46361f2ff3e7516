"""The report's section on the registry-entry experiments' claims: verdicts from cached runs, Markdown and HTML."""

from attnkit.lab.tour import report
from attnkit.lab.tour.experiments import positions, variants
from attnkit.lab.tour.report.claims import claim_lines, claims_html, claims_markdown


def _report(tmp_path, accuracy):
    records = [{"key": f"{t}/{m}", "task": t, "mechanism": m, "seed": s, "status": "ok", "result": {"accuracy": a}}
               for (t, m), accs in accuracy.items() for s, a in enumerate(accs)]
    return report.Report(tmp_path, None, records, report.summarize(records), [], None)


def test_each_claim_of_a_task_that_ran_is_decided(tmp_path):
    rep = _report(tmp_path, {("mqar_variants", "softmax"): [1.0, 0.99, 1.0],
                             ("mqar_variants", "softpick"): [0.99, 1.0, 0.98],
                             ("lag_copy", "alibi"): [0.99, 0.98, 1.0]})
    lines = {(c.task, c.a, c.b): result for c, result, _ in claim_lines(rep)}
    assert lines[("mqar_variants", "softpick", "softmax")] == "held"
    assert lines[("lag_copy", "alibi", positions.LEVEL)] == "held"
    assert lines[("mqar_variants", "sparsemax", "softmax")] == "not measured"
    assert len([1 for c, _, _ in claim_lines(rep) if c.task == "mqar_variants"]) == len(variants.CLAIMS)
    assert not any(c.task == "recurrent_recall" for c, _, _ in claim_lines(rep))
    text = "\n".join(claims_markdown(rep))
    assert "## Claims of the registry-entry experiments" in text and "**held**" in text
    assert any("<b>held</b>" in part for part in claims_html(rep))


def test_no_runs_no_section(tmp_path):
    rep = _report(tmp_path, {("mqar", "softmax"): [1.0]})
    assert claims_markdown(rep) == [] and claims_html(rep) == []
