"""The suite's Markdown (benchmarks.harness.report): tables per target, misses, and the BENCHMARKS.md rewrite."""

from __future__ import annotations

from benchmarks.harness.report import SCALING_END, SCALING_START, rewrite
from benchmarks.harness.rows import Row

from tests.benchmarks.helpers import render_suite as _render


def _fake_rows():
    ok = Row(1, "no mask", "B=1 H=8 L=128 D=64 float32", "fwd", "attnkit auto -> sdpa", "torch sdpa (no mask)", 8,
             [1e-3, 9e-4, 2e-3], [1e-3, 9e-4, 1.1e-3], 1.0, 1.3, "PASS", 0.0, True, 12.0, 0.1)
    miss = Row(2, "window ±128", "B=1 H=8 L=4096 D=64 float32", "fwd+bwd", "attnkit auto -> blocksparse",
               "torch sdpa (dense bool mask)", 5, [0.5, 0.4, 0.6], [1.0, 0.9, 1.2], 0.5, 0.2, "MISS", 1e-7, True,
               20.0, 0.2, 2**27, 2**28, density=0.08, profile=["aten::bmm: 1.0 ms (50%, 8 calls)"])
    return [ok, miss]


def test_rewrite_keeps_the_scaling_section_and_is_idempotent():
    scaling = f"{SCALING_START}\n## Scaling\n\n| a | b |\n|---|---|\n| 1 | 2 |\n{SCALING_END}"
    old = f"# Benchmarks\n\n<!-- core:start -->\nold core numbers\n<!-- core:end -->\n\n{scaling}\n\ntrailing\n"
    suite = _render(_fake_rows())
    once = rewrite(old, suite)
    assert scaling in once and "old core numbers" not in once and "trailing" not in once
    assert rewrite(once, suite) == once
    assert once.index("<!-- suite:end -->") < once.index(SCALING_START)
    assert rewrite("", suite) == "# Benchmarks\n\n" + suite


def test_render_shows_each_target_its_misses_and_profiles():
    text = _render(_fake_rows())
    assert "### 1. dense" in text and "### 2. window" in text
    assert "### 3. patterns\n\nNot measured in this run." in text
    assert "| **MISS** |" in text and "| PASS |" in text and "a note" in text
    assert "- target 2, window ±128" in text and "aten::bmm" in text
    assert "![window](plots/w.png)" in text
    assert "| 128 | 256 | 0.50 |" in text  # memory: attnkit MiB, theirs MiB, ratio
    assert "1000 (900-1200)" in text  # theirs ms, median (min-max)
    assert "- none" in _render(_fake_rows()[:1])


def test_goal_ratio_of_five_times_faster_is_shown_as_such():
    from benchmarks.harness.report import goal_text
    assert goal_text(0.2) == "≥ 5x faster" and goal_text(1.05) == "≤ 1.05x"
    assert goal_text(None, 0.25) == "memory ≤ 0.25x" and goal_text(None) == "—"


def test_rewrite_keeps_the_sections_other_scripts_write_with_their_headings():
    overhead = "## Dispatch overhead on common calls\n\n<!-- overhead:start -->\n| o |\n<!-- overhead:end -->"
    models = "## Inside a transformers model\n\n<!-- transformers:start -->\n| t |\n<!-- transformers:end -->"
    old = f"# Benchmarks\n\n<!-- suite:start -->\nold\n<!-- suite:end -->\n\n{overhead}\n\n{models}\n"
    once = rewrite(old, _render(_fake_rows()))
    assert overhead in once and models in once and "\nold\n" not in once
    assert rewrite(once, _render(_fake_rows())) == once
