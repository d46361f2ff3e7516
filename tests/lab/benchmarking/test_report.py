"""Markdown of benchmark rows (attnkit.lab.benchmarking.report): the table of pairs, the goals and the misses."""

from __future__ import annotations

from attnkit.lab.benchmarking.report import goal_text, misses, rows_table
from attnkit.lab.benchmarking.rows import Row


def fake_rows():
    ok = Row(1, "no mask", "B=1 H=8 L=128 D=64 float32", "fwd", "attnkit auto -> sdpa", "torch sdpa (no mask)", 8,
             [1e-3, 9e-4, 2e-3], [1e-3, 9e-4, 1.1e-3], 1.0, 1.3, "PASS", 0.0, True, 12.0, 0.1)
    miss = Row(2, "window ±128", "B=1 H=8 L=4096 D=64 float32", "fwd+bwd", "attnkit auto -> blocksparse",
               "torch sdpa (dense bool mask)", 5, [0.5, 0.4, 0.6], [1.0, 0.9, 1.2], 0.5, 0.2, "MISS", 1e-7, True,
               20.0, 0.2, 2**27, 2**28, density=0.08, profile=["aten::bmm: 1.0 ms (50%, 8 calls)"])
    return [ok, miss]


def test_rows_table_shows_times_memory_and_density_columns():
    text = "\n".join(rows_table(fake_rows()))
    assert "| **MISS** |" in text and "| PASS |" in text
    assert "| 128 | 256 | 0.50 |" in text  # memory: attnkit MiB, theirs MiB, ratio
    assert "1000 (900-1200)" in text  # theirs ms, median (min-max)
    assert "| 0.080 | 6.25 |" in text  # block density, ratio / density
    plain = "\n".join(rows_table(fake_rows()[:1]))
    assert "attnkit MiB" not in plain and "block density" not in plain


def test_misses_list_each_missed_target_with_its_profile():
    lines = misses(fake_rows())
    assert lines[0].startswith("- target 2, window ±128") and "aten::bmm" in lines[1]
    assert misses(fake_rows()[:1]) == ["- none: every target with a measured ratio was reached."]


def test_goal_ratio_of_five_times_faster_is_shown_as_such():
    assert goal_text(0.2) == "≥ 5x faster" and goal_text(1.05) == "≤ 1.05x"
    assert goal_text(None, 0.25) == "memory ≤ 0.25x" and goal_text(None) == "—"
