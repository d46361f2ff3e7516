"""The suite's section of BENCHMARKS.md (benchmarks/suite_report.py): one table per target, plots, misses."""

from __future__ import annotations

from tests.benchmarks.helpers import render_suite as _render
from tests.lab.benchmarking.test_report import fake_rows


def test_render_shows_each_target_its_misses_and_profiles():
    text = _render(fake_rows())
    assert "### 1. dense" in text and "### 2. window" in text
    assert "### 3. patterns\n\nNot measured in this run." in text
    assert "| **MISS** |" in text and "| PASS |" in text and "a note" in text
    assert "- target 2, window ±128" in text and "aten::bmm" in text
    assert "![window](plots/w.png)" in text
    assert "| 128 | 256 | 0.50 |" in text  # memory: attnkit MiB, theirs MiB, ratio
    assert "1000 (900-1200)" in text  # theirs ms, median (min-max)
    assert "- none" in _render(fake_rows()[:1])


def test_render_is_the_section_text_without_markers_or_heading():
    text = _render(fake_rows())
    assert text.startswith("intro\n\nCommand: `python benchmarks/run.py`") and "<!--" not in text
    assert "| float32 | 2048 | 100.0 | 190.0 |" in text  # the measured matmul ceiling
