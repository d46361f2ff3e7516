"""Published claims about one mechanism against another (or a level), decided by Welch's t over seeds.

A :class:`Claim` names a tour task, a mechanism ``a`` and either a second mechanism or a fixed level ``b``,
and one of two kinds (:func:`decide`; Welch 1947 through :func:`attnkit.lab.tour.welch.welch`, 95 %):

- ``"above"``: ``a``'s test accuracy exceeds ``b``'s. Held when the whole interval of the difference
  ``mean(a) - mean(b)`` lies above ``margin`` (0 unless given), did not hold when it lies at or below it,
  undecided otherwise.
- ``"within"``: ``a`` trains as ``b`` does ("matches softmax"): an equivalence test. Held when the
  interval lies inside ``(-margin, +margin)``; did not hold when it lies wholly outside; undecided when it
  straddles a bound.

Both need two seeds of each mechanism (a fixed level counts as one value with no spread).

Example:
    >>> c = Claim("x matches y", "a paper", "t", "x", "y", "within", 0.1)
    >>> decide(c, {"x": [0.90, 0.92, 0.91], "y": [0.91, 0.93, 0.90]})[0]
    'held'
    >>> decide(Claim("x above 50 %", "a paper", "t", "x", 0.5), {"x": [0.9, 0.95, 0.97]})[0]
    'held'
"""

from __future__ import annotations

import statistics
from typing import NamedTuple

from ....errors import ArgumentError
from ..welch import Welch, above, welch

__all__ = ["Claim", "KINDS", "decide", "decide_interval"]

KINDS = ("above", "within")


class Claim(NamedTuple):
    """A claim an experiment tests: its text and source, the tour task, the mechanism ``a``, the mechanism or level
    ``b`` it is compared with, the kind (:data:`KINDS`) and the margin in accuracy (a fraction)."""

    statement: str
    source: str
    task: str
    a: str
    b: str | float
    kind: str = "above"
    margin: float = 0.0

    def mechanisms(self) -> tuple[str, ...]:
        """The mechanisms whose runs decide the claim."""
        return (self.a,) if isinstance(self.b, float) else (self.a, self.b)


def decide_interval(kind: str, low: float, high: float, margin: float) -> str:
    """"held", "did not hold" or "undecided" for an interval ``[low, high]`` of ``a - b`` (see the module)."""
    if kind not in KINDS:
        raise ArgumentError(f"decide_interval: kind must be one of {KINDS}; got {kind!r}")
    if kind == "above":
        return above(low, high, margin)
    if -margin < low and high < margin:
        return "held"
    return "did not hold" if low >= margin or high <= -margin else "undecided"


def decide(claim: Claim, accuracies: dict[str, list[float]]) -> tuple[str, str]:
    """``(verdict, detail)`` of ``claim`` from each mechanism's test accuracies over seeds; "not measured" without
    two seeds of each of its mechanisms."""
    groups = [accuracies.get(m, []) for m in claim.mechanisms()]
    if any(len(g) < 2 for g in groups):
        return "not measured", ", ".join(f"{m}: {len(g)} seed(s)" for m, g in zip(claim.mechanisms(), groups,
                                                                                strict=True))
    other = groups[1] if len(groups) == 2 else [float(claim.b)]
    w: Welch = welch(groups[0], other)
    result = decide_interval(claim.kind, w.low, w.high, claim.margin)
    b_text = (f"{claim.b} {100 * statistics.fmean(other):.1f} %" if len(groups) == 2
              else f"the level {100 * float(claim.b):.0f} %")
    bound = (f"above {100 * claim.margin:+.0f} points" if claim.kind == "above"
             else f"inside +-{100 * claim.margin:.0f} points")
    detail = (f"{claim.a} {100 * statistics.fmean(groups[0]):.1f} % over {len(groups[0])} seeds against {b_text}: "
              f"difference {100 * w.difference:+.1f} points, {100 * w.confidence:.0f} % interval "
              f"[{100 * w.low:+.1f}, {100 * w.high:+.1f}] (t = {w.t:.2f}, df = {w.df:.1f}); needed {bound}")
    return result, detail
