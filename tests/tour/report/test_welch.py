"""Welch's t: Student's distribution against published quantiles and scipy, the interval, the verdicts."""

import math

import pytest

from attnkit.errors import ArgumentError
from attnkit.tour.report.welch import student_cdf, student_quantile, verdict, welch

# two-sided 95 % critical values of Student's t (any statistics table): df -> t_0.975
TABLE = {1: 12.7062, 2: 4.3027, 4: 2.7764, 10: 2.2281, 30: 2.0423, 10 ** 7: 1.9600}


@pytest.mark.parametrize("df", TABLE)
def test_quantiles_match_the_table_and_invert_the_distribution(df):
    q = student_quantile(0.975, df)
    assert q == pytest.approx(TABLE[df], abs=1e-4)
    assert student_cdf(q, df) == pytest.approx(0.975, abs=1e-12)
    assert student_quantile(0.025, df) == -q and student_cdf(0.0, df) == 0.5


def test_the_distribution_equals_scipys_at_fractional_degrees_of_freedom():
    stats = pytest.importorskip("scipy.stats")
    for df in (0.7, 2.5, 3.04, 17.3):
        for t in (-6.0, -1.3, 0.2, 2.9, 40.0):
            assert student_cdf(t, df) == pytest.approx(stats.t.cdf(t, df), rel=1e-10, abs=1e-14)
    with pytest.raises(ArgumentError, match="p must lie in"):
        student_quantile(1.0, 3)


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
    with pytest.raises(ArgumentError, match="at least two values"):
        welch([1.0], [0.5, 0.4])
