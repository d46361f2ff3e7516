"""benchmarks/under_load.py: quiet and busy rounds of one band row, the busy processes stopped after."""

from __future__ import annotations

from benchmarks import under_load


def test_main_measures_quiet_then_busy_stops_its_processes_and_writes_the_section(tmp_path, monkeypatch):
    started, real = [], under_load.busy

    def fake_busy(count):
        started.extend(real(1))  # one real process, to see it stopped
        return started

    monkeypatch.setattr(under_load, "busy", fake_busy)
    doc = tmp_path / "B.md"
    doc.write_text("# Benchmarks\n")
    assert under_load.main(["--length", "256", "--rounds", "2", "--settle", "0", "--write", str(doc)]) == 0
    assert started and all(p.poll() is not None for p in started)  # stopped
    text = doc.read_text()
    assert "<!-- under-load:start -->" in text and f"## {under_load.TITLE}" in text
    assert "| window +-128 fwd, L = 256 | quiet |" in text and "| window +-128 fwd, L = 256 | busy |" in text
    assert "Busy ratio over quiet ratio:" in text
