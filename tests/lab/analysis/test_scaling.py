"""analysis.scaling: child-process measurements, the exponent fit, the table and its failure rows.

Nothing here asserts a time except the opt-in slow test (the issue's acceptance): the
exponent fit is checked on synthetic data, measurements only for being well-formed.
"""

from __future__ import annotations

import math

import pytest

from attnkit.errors import ArgumentError
from attnkit.lab.analysis.scaling import Mechanism, ScalingRow, ScalingTable, fit_exponent, scaling

TINY = {"batch": 1, "heads": 2, "head_dim": 8, "dim": 16}


def _synthetic():
    lengths = (64, 128, 256, 512)
    rows = [ScalingRow("square", n, 3e-9 * n**2, 1e-6, 7 * n) for n in lengths]
    rows += [ScalingRow("line", n, 5e-7 * n, 0.0, None) for n in lengths[:2]]
    rows += [ScalingRow("line", lengths[2], None, None, None, "timeout"),
             ScalingRow("line", lengths[3], None, None, None, "skipped")]
    return ScalingTable(tuple(rows), lengths, repeats=1)


def test_fit_exponent_recovers_exact_powers():
    lengths = [1024, 2048, 4096, 8192, 16384]
    assert abs(fit_exponent(lengths, [2.5e-9 * n**2 for n in lengths]) - 2.0) < 1e-12
    assert abs(fit_exponent(lengths, [7.0 * n for n in lengths]) - 1.0) < 1e-12
    assert abs(fit_exponent(lengths, [n**1.5 for n in lengths]) - 1.5) < 1e-12
    assert fit_exponent([64, 128], [1.0, None]) is None  # one usable point
    assert fit_exponent([64, 64], [1.0, 2.0]) is None  # no spread in L


def test_table_exponents_series_and_markdown():
    table = _synthetic()
    assert abs(table.exponent("square") - 2.0) < 1e-12
    assert abs(table.memory_exponent("square") - 1.0) < 1e-12
    assert abs(table.exponent("line") - 1.0) < 1e-12 and table.memory_exponent("line") is None
    series = table.series()
    assert list(series) == ["square", "line"]
    assert series["square"][1] == (128, 3e-9 * 128**2, 7 * 128) and len(series["line"]) == 2
    md = table.markdown()
    assert md.splitlines()[0] == ("| mechanism | L=64 ms | L=128 ms | L=256 ms | L=512 ms | L=64 MiB | L=128 MiB | "
                                  "L=256 MiB | L=512 MiB | time exponent | memory exponent |")
    line = next(x for x in md.splitlines() if x.startswith("| line"))
    assert "| timeout | skipped |" in line and "1.00 (2 of 4 L)" in line
    assert "| configuration |" in table.markdown({"square": "c"}, memory_exponent=False)
    with pytest.raises(ArgumentError, match="no mechanism 'cube'"):
        table.exponent("cube")


def test_measures_each_length_in_a_child_process():
    labels = []
    table = scaling(["sliding_window(8, 8)"], [128, 64], repeats=1, sizes=TINY, threads=1, progress=labels.append)
    assert labels == ["sliding_window(8, 8) L=64", "sliding_window(8, 8) L=128"]
    assert table.lengths == (64, 128) and [r.status for r in table.rows] == ["ok", "ok"]
    for row in table.rows:
        assert row.median_s > 0 and row.spread == 0.0 and row.peak_bytes is not None
    assert table.exponent("sliding_window(8, 8)") is not None
    assert [p[0] for p in table.series()["sliding_window(8, 8)"]] == [64, 128]


def test_a_module_row_forward_only_without_memory():
    table = scaling([Mechanism("tiny local", "local", {"size": 4})], [64], repeats=2, backward=False, memory=False,
                    sizes=TINY, threads=1)
    (row,) = table.rows
    assert row.mechanism == "tiny local" and row.status == "ok" and row.peak_bytes is None and row.spread >= 0
    assert table.series() == {"tiny local": [(64, row.median_s, None)]}


def test_a_timeout_skips_the_longer_lengths_and_a_crash_is_reported():
    table = scaling(["dense"], [64, 128], repeats=1, sizes=TINY, timeout=1e-3)
    assert [r.status for r in table.rows] == ["timeout", "skipped"] and table.series() == {}
    table = scaling([("short linformer", "linformer", {"max_len": 32})], [64], repeats=1, sizes=TINY, threads=1)
    assert table.rows[0].status == "failed" and "failed" in table.markdown()
    assert "max_len" in table.rows[0].error  # the child's error, for the user to read


def test_bad_arguments_are_errors_before_any_child_runs():
    with pytest.raises(ArgumentError, match="windw"):
        scaling(["dense"], [64], sizes={"windw": 3})
    with pytest.raises(ArgumentError, match="unknown mechanism"):
        scaling(["nosuch"], [64])
    with pytest.raises(ArgumentError, match="repeats"):
        scaling(["dense"], [64], repeats=0)
    with pytest.raises(ArgumentError, match="distinct"):
        scaling(["dense", "dense"], [64])
    with pytest.raises(ArgumentError, match="window"):
        scaling([("w", "sliding-window", {"window": -2})], [64])


@pytest.mark.slow
def test_dense_is_quadratic_and_a_sliding_window_linear():
    """The issue's acceptance: over L = 1024 ... 16384, B=1, H=8, D=64, forward+backward."""
    lengths = [1024, 2048, 4096, 8192, 16384]
    table = scaling(["dense", "sliding_window(128,128)"], lengths, repeats=3, timeout=900)
    dense, window = table.exponent("dense"), table.exponent("sliding_window(128,128)")
    assert dense is not None and 1.8 <= dense <= 2.2, table.markdown()
    assert window is not None and 0.85 <= window <= 1.15, table.markdown()
    assert not math.isnan(dense + window)
