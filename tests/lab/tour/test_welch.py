"""Welch's t-test (src/attnkit/tour/welch.py): Student's distribution against published quantiles and scipy,
the Welch-Satterthwaite formula written out here, groups without spread, the verdicts, bad input."""

from __future__ import annotations

import math
import statistics

import pytest

from attnkit.errors import ArgumentError
from attnkit.lab.tour.welch import student_cdf, student_quantile, verdict, welch

# two-sided 95 % critical values of Student's t (any statistics table): df -> t_0.975
TABLE = {1: 12.7062, 2: 4.3027, 4: 2.7764, 10: 2.2281, 30: 2.0423, 10 ** 7: 1.9600}


@pytest.mark.parametrize("df", TABLE)
def test_quantiles_match_the_table_and_invert_the_distribution(df):
    q = student_quantile(0.975, df)
    assert q == pytest.approx(TABLE[df], abs=1e-4)
    assert student_cdf(q, df) == pytest.approx(0.975, abs=1e-12)
    assert student_quantile(0.025, df) == -q and student_cdf(0.0, df) == 0.5


@pytest.mark.parametrize("df", [1.0, 1.7, 2.0, 4.48, 11.0, 120.0])
@pytest.mark.parametrize("p", [0.55, 0.9, 0.975, 0.999])
def test_the_quantile_is_scipys(df, p):
    stats = pytest.importorskip("scipy.stats")
    q = student_quantile(p, df)
    assert q == pytest.approx(stats.t.ppf(p, df), rel=1e-9)
    assert 2 * (1 - student_cdf(q, df)) == pytest.approx(2 * (1 - p), rel=1e-9)  # the two-sided tail


def test_the_distribution_equals_scipys_at_fractional_degrees_of_freedom():
    stats = pytest.importorskip("scipy.stats")
    for df in (0.7, 2.5, 3.04, 17.3):
        for t in (-6.0, -1.3, 0.2, 2.9, 40.0):
            assert student_cdf(t, df) == pytest.approx(stats.t.cdf(t, df), rel=1e-10, abs=1e-14)


def test_one_degree_of_freedom_is_the_cauchy_distribution():
    for p in (0.6, 0.8, 0.975):  # Student's t with df = 1: quantile tan(pi (p - 1/2))
        assert student_quantile(p, 1.0) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)


def test_welch_follows_the_welch_satterthwaite_formula():
    a, b = [0.91, 0.95, 0.97, 0.93], [0.52, 0.61, 0.40]
    w = welch(a, b)
    va, vb = statistics.variance(a) / 4, statistics.variance(b) / 3
    assert w.difference == pytest.approx(statistics.fmean(a) - statistics.fmean(b), abs=1e-15)
    assert w.se == pytest.approx(math.sqrt(va + vb), rel=1e-12) and w.t == pytest.approx(w.difference / w.se)
    assert w.df == pytest.approx((va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 2), rel=1e-12)
    half = student_quantile(0.975, w.df) * w.se
    assert (w.low, w.high) == pytest.approx((w.difference - half, w.difference + half), rel=1e-12)
    stats = pytest.importorskip("scipy.stats")
    assert stats.ttest_ind(a, b, equal_var=False).df == pytest.approx(w.df, rel=1e-12)


def test_welch_is_the_written_formula_and_decides_by_its_interval():
    a, b = [0.9, 0.95, 1.0], [0.3, 0.35, 0.31]
    w = welch(a, b)
    va, vb = 0.0025 / 3, (0.3 ** 2 + 0.35 ** 2 + 0.31 ** 2 - 3 * 0.32 ** 2) / 2 / 3
    assert w.difference == pytest.approx(0.63) and w.t == pytest.approx(0.63 / math.sqrt(va + vb))
    assert w.df == pytest.approx((va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2))
    assert w.high - w.difference == pytest.approx(student_quantile(0.975, w.df) * math.sqrt(va + vb))
    assert verdict(w) == "held" and verdict(welch(b, a)) == "did not hold"
    assert verdict(welch([0.5, 0.9, 0.2], [0.4, 0.6, 0.5])) == "undecided"  # the spread swamps the difference
    assert verdict(welch([1.0, 1.0, 1.0], [1.0, 1.0, 1.0])) == "did not hold"  # equal: not above
    assert verdict(welch([1.0, 1.0], [0.5, 0.5])) == "held"


def test_groups_without_spread_give_a_point_or_the_other_groups_width():
    still = welch([0.5, 0.5], [0.25, 0.25, 0.25])
    assert (still.low, still.high, still.se, still.df, still.t) == (0.25, 0.25, 0.0, math.inf, math.inf)
    one = welch([0.5], [0.2, 0.3, 0.4])  # one value: no variance; the other group's decides
    assert one.df == pytest.approx(2.0) and one.se == pytest.approx(math.sqrt(0.01 / 3))
    assert one.high - one.low == pytest.approx(2 * student_quantile(0.975, 2.0) * one.se)
    assert welch([0.7], [0.7]).t == 0.0 and verdict(welch([0.7], [0.7])) == "did not hold"


def test_the_confidence_sets_the_width():
    a, b = [0.9, 0.8, 0.85], [0.5, 0.6, 0.4]
    narrow, wide = welch(a, b, confidence=0.5), welch(a, b, confidence=0.99)
    assert narrow.high - narrow.low == pytest.approx(2 * student_quantile(0.75, narrow.df) * narrow.se)
    assert wide.low < narrow.low < narrow.high < wide.high and wide.confidence == 0.99


def test_bad_input_is_an_argument_error():
    with pytest.raises(ArgumentError, match="a must hold at least one value, all finite"):
        welch([], [1.0])
    with pytest.raises(ArgumentError, match="b must hold at least one value, all finite"):
        welch([1.0], [float("nan")])
    with pytest.raises(ArgumentError, match=r"confidence must lie in \(0, 1\); got 1.0"):
        welch([1.0, 2.0], [0.5, 0.4], confidence=1.0)
    with pytest.raises(ArgumentError, match="p must lie in"):
        student_quantile(1.0, 3)
    with pytest.raises(ArgumentError, match="df must be > 0; got 0"):
        student_cdf(1.0, 0)
