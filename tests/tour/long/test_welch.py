"""Welch's t-test (src/attnkit/tour/long/welch.py) against scipy and against the formulas written out here."""

from __future__ import annotations

import math
import statistics

import pytest

from attnkit.errors import ArgumentError
from attnkit.tour.long.welch import difference_interval, t_quantile, t_two_sided_p, welch


@pytest.mark.parametrize("nu", [1.0, 1.7, 2.0, 4.48, 11.0, 120.0])
@pytest.mark.parametrize("p", [0.55, 0.9, 0.975, 0.999])
def test_the_t_quantile_is_scipys(nu, p):
    stats = pytest.importorskip("scipy.stats")
    assert t_quantile(p, nu) == pytest.approx(stats.t.ppf(p, nu), rel=1e-9)
    assert t_two_sided_p(t_quantile(p, nu), nu) == pytest.approx(2 * (1 - p), rel=1e-9)


def test_one_degree_of_freedom_is_the_cauchy_distribution():
    for p in (0.6, 0.8, 0.975):  # Student's t with nu = 1: quantile tan(pi (p - 1/2))
        assert t_quantile(p, 1.0) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)


def test_welch_follows_the_welch_satterthwaite_formula():
    a, b = [0.91, 0.95, 0.97, 0.93], [0.52, 0.61, 0.40]
    diff, se, nu = welch(a, b)
    va, vb = statistics.variance(a) / 4, statistics.variance(b) / 3
    assert diff == pytest.approx(statistics.fmean(a) - statistics.fmean(b), abs=1e-15)
    assert se == pytest.approx(math.sqrt(va + vb), rel=1e-12)
    assert nu == pytest.approx((va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 2), rel=1e-12)
    low, high = difference_interval(a, b)
    half = t_quantile(0.975, nu) * se
    assert (low, high) == pytest.approx((diff - half, diff + half), rel=1e-12)
    stats = pytest.importorskip("scipy.stats")
    assert stats.ttest_ind(a, b, equal_var=False).df == pytest.approx(nu, rel=1e-12)


def test_groups_without_spread_give_a_point_or_the_other_groups_width():
    assert difference_interval([0.5, 0.5], [0.25, 0.25, 0.25]) == (0.25, 0.25)
    low, high = difference_interval([0.5], [0.2, 0.3, 0.4])  # one value: no variance; the other group's decides
    _, se, nu = welch([0.5], [0.2, 0.3, 0.4])
    assert nu == pytest.approx(2.0) and high - low == pytest.approx(2 * t_quantile(0.975, 2.0) * se)


def test_bad_input_is_an_argument_error():
    with pytest.raises(ArgumentError, match="finite"):
        welch([], [1.0])
    with pytest.raises(ArgumentError, match="finite"):
        welch([float("nan")], [1.0])
    with pytest.raises(ArgumentError, match=r"0\.5 <= p < 1"):
        t_quantile(0.4, 3.0)
