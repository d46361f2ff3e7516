"""Welch's t: is one group's mean above another's, given the spread of each over seeds?

Welch 1947 (Biometrika 34, "The generalization of 'Student's' problem when several different
population variances are involved"): the difference of two means ``d = mean(a) - mean(b)``, its
standard error ``se = sqrt(var(a) / n_a + var(b) / n_b)`` (sample variances) and the
Welch-Satterthwaite degrees of freedom ``df = se^4 / ((var(a) / n_a)^2 / (n_a - 1) + (var(b) / n_b)^2
/ (n_b - 1))``; the confidence interval is ``d +- t_q(df) se`` with ``t_q`` Student's t quantile. A
claim "a is above b" :func:`verdict` is held when the whole interval lies above 0, did not hold
when none of it does, and is undecided otherwise. No scipy: Student's distribution function is
the regularised incomplete beta function, evaluated by its continued fraction.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import NamedTuple

from ...errors import ArgumentError

__all__ = ["Welch", "welch", "verdict", "student_cdf", "student_quantile"]


class Welch(NamedTuple):
    """``difference`` of the means, its interval ``[low, high]`` at ``confidence``, ``t`` and ``df``."""

    difference: float
    low: float
    high: float
    t: float
    df: float
    confidence: float


def _beta_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of the incomplete beta function, by the modified Lentz method."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return result


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularised incomplete beta function ``I_x(a, b)``, 0 <= x <= 1."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):  # the fraction converges fast on this side; the other by symmetry
        return front * _beta_fraction(x, a, b) / a
    return 1.0 - front * _beta_fraction(1.0 - x, b, a) / b


def student_cdf(t: float, df: float) -> float:
    """``P(T <= t)`` for Student's t with ``df > 0`` degrees of freedom (not necessarily whole)."""
    tail = 0.5 * _incomplete_beta(df / (df + t * t), df / 2, 0.5)
    return 1.0 - tail if t >= 0 else tail


def student_quantile(p: float, df: float) -> float:
    """The ``t`` with ``student_cdf(t, df) = p`` (``0 < p < 1``), by bisection."""
    if not 0 < p < 1:
        raise ArgumentError(f"student_quantile: p must lie in (0, 1); got {p!r}")
    if p < 0.5:
        return -student_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while student_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if student_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def welch(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> Welch:
    """Welch's comparison of ``mean(a) - mean(b)`` (each at least two values; see the module docstring).

    Example:
        >>> w = welch([0.9, 0.95, 1.0], [0.3, 0.35, 0.31])
        >>> round(w.difference, 3), w.low > 0
        (0.63, True)
    """
    if len(a) < 2 or len(b) < 2:
        raise ArgumentError(f"welch: each group needs at least two values; got {len(a)} and {len(b)}")
    if not 0 < confidence < 1:
        raise ArgumentError(f"welch: confidence must lie in (0, 1); got {confidence!r}")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    difference, se = statistics.fmean(a) - statistics.fmean(b), math.sqrt(va + vb)
    if se == 0:  # no spread at all: the difference is what it is
        return Welch(difference, difference, difference, math.copysign(math.inf, difference) if difference else 0.0,
                     math.inf, confidence)
    df = se ** 4 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    half = student_quantile(1 - (1 - confidence) / 2, df) * se
    return Welch(difference, difference - half, difference + half, difference / se, df, confidence)


def verdict(w: Welch) -> str:
    """"held" (the interval lies above 0), "did not hold" (none of it does) or "undecided"."""
    if w.low > 0:
        return "held"
    return "did not hold" if w.high <= 0 else "undecided"
