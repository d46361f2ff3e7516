"""benchmarks/sinks.py: one pair per path a sink changes, checked equal, timed, written as a section."""

from __future__ import annotations

from benchmarks import sinks


def test_pairs_name_the_path_and_agree_before_timing():
    rows = sinks.pairs(600, backward=True)
    assert len(rows) == len(sinks.CALLS) and all(r.goal == sinks.GOAL for r in rows)
    assert {"torch-sdpa", "band-windows", "bias-slabs"} <= {r.name.rsplit("(", 1)[1].rstrip(")") for r in rows}
    for row in rows:
        a, b = row.ours(), row.theirs()  # the sinks take ~e^-30 of a row: the same result
        assert (a - b).abs().max() < 1e-5


def test_main_writes_the_section(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sinks, "CALLS", {"causal": sinks.CALLS["causal"]})
    doc = tmp_path / "B.md"
    assert sinks.main(["--length", "64", "--rounds", "1", "--write", str(doc)]) == 0
    text = doc.read_text()
    assert f"## {sinks.TITLE}" in text and "`python benchmarks/sinks.py --length 64 --rounds 1`" in text
    assert text.count("| causal, L=64") == 2 and "the same call without sinks" in capsys.readouterr().out
