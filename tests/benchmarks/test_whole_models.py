"""benchmarks/whole_models.py: the rows of attnkit.lab.benchmarking.whole_models written into their section."""

from __future__ import annotations

from benchmarks import whole_models as script


def test_main_writes_the_section(tmp_path, monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(script, "run", lambda sizes, rows, **kw: seen.append((sizes, rows, kw)) or [])
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n")
    for _ in range(2):
        assert script.main(["--rounds", "2", "--rows", "generate,causal", "--sizes", "length=16", "--write",
                            str(doc)]) == 0
    sizes, rows, kw = seen[0]
    assert sizes.length == 16 and rows == ("causal", "generate") and kw["rounds"] == 2
    text = doc.read_text()
    assert text.count("## Whole models") == 1 and text.count("<!-- models:start -->") == 1
    assert "`python -m benchmarks.whole_models --rounds 2 --rows causal,generate --sizes length=16`" in text
    assert "| row | against | attnkit ms |" in capsys.readouterr().out
