"""benchmarks/ceiling.py: the ceiling section, measured by attnkit.lab.benchmarking.roofline, with its notes."""

from __future__ import annotations

from attnkit.lab.benchmarking import roofline
from benchmarks import ceiling


def test_main_writes_the_section_with_the_command_and_the_notes(tmp_path, monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(ceiling, "run", lambda cfg, log: seen.append(cfg) or ([], {"mm": 1.0}))
    doc = tmp_path / "B.md"
    doc.write_text("# Benchmarks\n\n## Suite\n\n<!-- suite:start -->\ns\n<!-- suite:end -->\n")
    for _ in range(2):  # the second write replaces the first
        assert ceiling.main(["--lengths", "512", "--rounds", "3", "--write", str(doc)]) == 0
    assert seen[0] == roofline.Config(lengths=(512,), rounds=3)
    text = doc.read_text()
    assert text.count("<!-- ceiling:start -->") == 1 and f"## {ceiling.TITLE}" in text and "<!-- suite:end -->" in text
    assert "`python benchmarks/ceiling.py --lengths 512 --rounds 3`" in text and ceiling.NOTES in text
    assert "| path | mask | L |" in capsys.readouterr().out
