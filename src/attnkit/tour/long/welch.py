"""Welch's t-test: is one group's mean above another's, given the spread of each over seeds?

Welch 1947, "The generalization of 'Student's' problem when several different population variances
are involved", Biometrika 34. For samples ``a`` (n_a values) and ``b`` (n_b), with sample variances
``s_a^2, s_b^2`` (n - 1 in the denominator)::

    d = mean(a) - mean(b),    se = sqrt(s_a^2 / n_a + s_b^2 / n_b)
    nu = se^4 / ((s_a^2 / n_a)^2 / (n_a - 1) + (s_b^2 / n_b)^2 / (n_b - 1))     (Welch-Satterthwaite)
    interval = d -+ t_{1 - alpha/2, nu} se

The Student t quantile is found by bisection on its distribution function, written through the
regularized incomplete beta function ``I_x(a, b)`` (continued fraction, Lentz's method; Press et
al., Numerical Recipes, 3rd ed., Sec. 6.4): ``P(|T| > t) = I_{nu / (nu + t^2)}(nu / 2, 1 / 2)``.

Two equal, constant groups have ``se = 0``: the interval is the point ``d``. A group of one value
has no spread; its variance counts as 0 (the other group's spread then decides the width).

Example:
    >>> round(t_quantile(0.975, 2), 3), round(t_quantile(0.975, 30), 3)
    (4.303, 2.042)
    >>> low, high = difference_interval([0.9, 0.92, 0.95], [0.5, 0.52, 0.48])
    >>> 0.35 < low < high < 0.5
    True
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from ...errors import ArgumentError

__all__ = ["t_quantile", "t_two_sided_p", "difference_interval", "welch"]

_EPS, _TINY = 1e-15, 1e-300


def _beta_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of ``I_x(a, b)`` (converges fast for ``x < (a + 1) / (a + b + 2)``)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 400):
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
    """The regularized incomplete beta function ``I_x(a, b)`` for ``0 <= x <= 1``."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(1.0 - x, b, a) / b


def t_two_sided_p(t: float, nu: float) -> float:
    """``P(|T| >= |t|)`` for Student's t with ``nu > 0`` degrees of freedom."""
    return _incomplete_beta(nu / (nu + t * t), nu / 2.0, 0.5)


def t_quantile(p: float, nu: float) -> float:
    """The ``p`` quantile (``0.5 <= p < 1``) of Student's t with ``nu > 0`` degrees of freedom."""
    if not (0.5 <= p < 1.0) or not nu > 0:
        raise ArgumentError(f"t_quantile: need 0.5 <= p < 1 and nu > 0; got p={p!r}, nu={nu!r}")
    tail, low, high = 2.0 * (1.0 - p), 0.0, 1.0
    while t_two_sided_p(high, nu) > tail:
        high *= 2.0
    for _ in range(200):  # bisection: the two-sided p falls as t grows
        mid = 0.5 * (low + high)
        low, high = (mid, high) if t_two_sided_p(mid, nu) > tail else (low, mid)
    return 0.5 * (low + high)


def _moments(values: Sequence[float], name: str) -> tuple[float, float, int]:
    values = [float(v) for v in values]
    if not values or not all(math.isfinite(v) for v in values):
        raise ArgumentError(f"welch: {name} must hold at least one finite value; got {values!r}")
    var = statistics.variance(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), var / len(values), len(values)


def welch(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """``(mean(a) - mean(b), its standard error, Welch-Satterthwaite degrees of freedom)``.

    The degrees of freedom are ``inf`` when neither group varies, and count only the groups that do.
    """
    mean_a, va, na = _moments(a, "a")
    mean_b, vb, nb = _moments(b, "b")
    parts = [(v, n) for v, n in ((va, na), (vb, nb)) if v > 0 and n > 1]
    se2 = va + vb
    nu = se2 * se2 / sum(v * v / (n - 1) for v, n in parts) if parts else math.inf
    return mean_a - mean_b, math.sqrt(se2), nu


def difference_interval(a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95) -> tuple[float, float]:
    """Welch's two-sided ``confidence`` interval for ``mean(a) - mean(b)``."""
    diff, se, nu = welch(a, b)
    if se == 0.0:
        return diff, diff
    half = se * (t_quantile(0.5 + confidence / 2.0, nu) if math.isfinite(nu) else _normal_quantile(confidence))
    return diff - half, diff + half


def _normal_quantile(confidence: float) -> float:
    """The two-sided normal quantile (the t quantile's limit), by bisection on ``erfc``."""
    low, high = 0.0, 40.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if math.erfc(mid / math.sqrt(2.0)) > 1.0 - confidence else (low, mid)
    return 0.5 * (low + high)
