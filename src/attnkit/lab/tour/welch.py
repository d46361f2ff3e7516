"""Welch's t-test: is one group's mean above another's, given the spread of each over seeds?

Welch 1947, "The generalization of 'Student's' problem when several different population variances
are involved", Biometrika 34. For samples ``a`` (``n_a`` values) and ``b`` (``n_b``), with sample
variances ``s_a^2, s_b^2`` (``n - 1`` in the denominator)::

    d = mean(a) - mean(b),    se = sqrt(s_a^2 / n_a + s_b^2 / n_b),    t = d / se
    df = se^4 / ((s_a^2 / n_a)^2 / (n_a - 1) + (s_b^2 / n_b)^2 / (n_b - 1))     (Welch-Satterthwaite)
    interval = d -+ t_{1 - alpha/2, df} se                                      (confidence 1 - alpha)

A group of one value has no spread: its variance counts as 0, and ``df`` counts only the groups
that vary (a group of values against a fixed level, e.g. chance, has ``df = n - 1``). Two groups
without spread have ``se = 0``: the interval is the point ``d`` and ``df = inf``.

A claim "a is above b" (:func:`verdict`) held when the whole interval lies above 0, did not hold
when none of it does, and is undecided otherwise.

No scipy: Student's distribution is written through the regularised incomplete beta function,
``P(|T| > t) = I_{df / (df + t^2)}(df / 2, 1 / 2)``, evaluated by its continued fraction (modified
Lentz method; Press et al., Numerical Recipes, 3rd ed., Sec. 6.4); the quantile is found by
bisection on that tail.

Example:
    >>> round(student_quantile(0.975, 2), 3), round(student_quantile(0.975, 30), 3)
    (4.303, 2.042)
    >>> w = welch([0.9, 0.95, 1.0], [0.3, 0.35, 0.31])
    >>> round(w.difference, 3), w.low > 0, verdict(w)
    (0.63, True, 'held')
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import NamedTuple

from ...errors import ArgumentError

__all__ = ["Welch", "welch", "verdict", "above", "student_cdf", "student_quantile"]

_EPS, _TINY = 1e-15, 1e-300


class Welch(NamedTuple):
    """``difference`` of the means, its standard error ``se``, its interval ``[low, high]`` at ``confidence``,
    ``t = difference / se`` and the degrees of freedom ``df``."""

    difference: float
    se: float
    low: float
    high: float
    t: float
    df: float
    confidence: float


def _beta_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of ``I_x(a, b)`` (converges fast for ``x < (a + 1) / (a + b + 2)``)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularised incomplete beta function ``I_x(a, b)`` for ``0 <= x <= 1``."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):  # the fraction converges fast on this side; the other by symmetry
        return math.exp(log_front) * _beta_fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(1.0 - x, b, a) / b


def _check_df(who: str, df: float) -> None:
    if not df > 0:
        raise ArgumentError(f"{who}: df must be > 0; got {df!r}")


def _upper_tail(t: float, df: float) -> float:
    """``P(T > |t|)``: half the two-sided tail, computed directly so that small tails keep their digits."""
    return 0.5 * _incomplete_beta(df / (df + t * t), df / 2.0, 0.5)


def student_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df > 0`` degrees of freedom (not necessarily whole)."""
    _check_df("student_cdf", df)
    tail = _upper_tail(t, df)
    return 1.0 - tail if t >= 0 else tail


def student_quantile(p: float, df: float) -> float:
    """The ``t`` with ``student_cdf(t, df) = p`` (``0 < p < 1``, ``df > 0``), by bisection on the tail."""
    if not 0 < p < 1:
        raise ArgumentError(f"student_quantile: p must lie in (0, 1); got {p!r}")
    _check_df("student_quantile", df)
    if p < 0.5:
        return -student_quantile(1 - p, df)
    tail, low, high = 1.0 - p, 0.0, 1.0
    while _upper_tail(high, df) > tail:
        high *= 2.0
    for _ in range(200):  # the tail falls as t grows
        mid = 0.5 * (low + high)
        low, high = (mid, high) if _upper_tail(mid, df) > tail else (low, mid)
    return 0.5 * (low + high)


def _moments(values: Sequence[float], name: str) -> tuple[float, float, int]:
    """Mean, variance of the mean (0 for one value) and count of a group."""
    values = [float(v) for v in values]
    if not values or not all(math.isfinite(v) for v in values):
        raise ArgumentError(f"welch: {name} must hold at least one value, all finite; got {values!r}")
    var = statistics.variance(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), var / len(values), len(values)


def welch(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Welch:
    """Welch's comparison of ``mean(a) - mean(b)`` at ``confidence`` (see the module docstring).

    Example:
        >>> w = welch([0.5], [0.2, 0.3, 0.4])  # one value: the other group's spread decides
        >>> round(w.difference, 3), w.df
        (0.2, 2.0)
    """
    if not 0 < confidence < 1:
        raise ArgumentError(f"welch: confidence must lie in (0, 1); got {confidence!r}")
    mean_a, va, na = _moments(a, "a")
    mean_b, vb, nb = _moments(b, "b")
    difference, se = mean_a - mean_b, math.sqrt(va + vb)
    if se == 0.0:  # no spread at all: the difference is what it is
        t = math.copysign(math.inf, difference) if difference else 0.0
        return Welch(difference, 0.0, difference, difference, t, math.inf, confidence)
    df = (va + vb) ** 2 / sum(v * v / (n - 1) for v, n in ((va, na), (vb, nb)) if v > 0)
    half = student_quantile(0.5 + confidence / 2.0, df) * se
    return Welch(difference, se, difference - half, difference + half, difference / se, df, confidence)


def verdict(w: Welch, margin: float = 0.0) -> str:
    """"held" (the interval lies above ``margin``), "did not hold" (none of it does) or "undecided"."""
    return above(w.low, w.high, margin)


def above(low: float, high: float, margin: float = 0.0) -> str:
    """The verdict on "a is above b" from an interval ``[low, high]`` of ``a - b``: "held" when it lies above
    ``margin``, "did not hold" when none of it does, else "undecided"."""
    if low > margin:
        return "held"
    return "did not hold" if high <= margin else "undecided"
