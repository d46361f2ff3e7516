"""The papers' orderings on the long-range suite, written once as data and decided from the seeds' spread.

A :class:`Claim` compares two groups of mechanisms on one measure: ``"accuracy"`` on the
retrieval-style tasks of the suite it reads (:attr:`.suite.SuiteTask.retrieval`; every one unless
it names some), or ``"speed"`` (training steps per second at the longest length, :mod:`.speed`).
Each (better, worse) pair is decided by Welch's t-test (:mod:`attnkit.lab.tour.welch`): the 95 %
interval of the difference of means, over seeds (accuracy) or over timed steps (speed):

- **held**: the interval lies above 0 (better is above worse, beyond the noise);
- **did not hold**: the interval lies below :data:`MARGIN` (better is not ahead by even that much;
  an ordering the other way, or two mechanisms that both reach the same accuracy);
- **undecided**: the interval holds both (the difference is within the noise), the mechanism said
  to be better is itself within the noise of chance (:data:`NEAR_CHANCE`): no ordering is read
  from runs that learned nothing, or a side has a single value (one seed has no spread).

A claim holds when every pair held, did not hold when a pair did not, and is undecided otherwise.
Mechanism groups come from the roster's flags (:mod:`.roster`), so a new mechanism joins its claims.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..welch import welch
from .roster import MECHANISMS
from .suite import TASKS

__all__ = ["Claim", "Comparison", "Verdict", "CLAIMS", "check", "compare", "deciding_runs", "MOST_SEEDS", "at_chance",
           "needed_pairs", "needed_speed", "RETRIEVAL_TASKS", "MARGIN", "NEAR_CHANCE", "CONFIDENCE", "HELD", "NOT_HELD",
           "UNDECIDED"]

RETRIEVAL_TASKS = tuple(t.name for t in TASKS.values() if t.retrieval)
_GLOBAL = tuple(m.name for m in MECHANISMS.values() if m.global_tokens)
_LOCAL = tuple(m.name for m in MECHANISMS.values() if m.local_only)
_FIXED_STATE = tuple(m.name for m in MECHANISMS.values() if m.fixed_state)
_CHOSEN = tuple(m.name for m in MECHANISMS.values() if m.chosen_blocks)
_LINEAR_TIME = tuple(m.name for m in MECHANISMS.values() if m.linear_time and not m.images_only)
_LRA_FASTEST = (*_FIXED_STATE, *_LOCAL, "perceiver")  # kernel, low-rank, window and latent: no n x n work at all

CONFIDENCE = 0.95
MARGIN = 0.02
"""An accuracy lead of less than 2 points (or any speed lead below 0) is no lead: the claim did not hold."""
NEAR_CHANCE = 0.05
"""A mechanism whose accuracy is not at least 5 points above chance, beyond the noise, learned nothing."""
HELD, NOT_HELD, UNDECIDED = "held", "did not hold", "undecided"


@dataclass(frozen=True)
class Claim:
    """A stated ordering: ``better`` above ``worse`` on ``measure`` (``"accuracy"`` or ``"speed"``); an accuracy
    claim reads ``tasks``, retrieval-style tasks of the suite (default: every one)."""

    key: str
    statement: str
    source: str
    measure: str
    better: tuple[str, ...]
    worse: tuple[str, ...]
    tasks: tuple[str, ...] = RETRIEVAL_TASKS


CLAIMS: tuple[Claim, ...] = (
    Claim("global-beats-local",
          "On retrieval-style tasks, dense attention and global-token mechanisms (Longformer, BigBird) beat "
          "local and sliding-window attention.",
          "Tay et al. 2020, arXiv:2011.04006, Sec. 4 (Table 1, Retrieval); Beltagy et al. 2020; Zaheer et al. 2020",
          "accuracy", ("softmax", *_GLOBAL), _LOCAL),
    Claim("fixed-state-behind-softmax",
          "Linformer, Performer and linear attention fall behind softmax on exact recall.",
          "Arora et al. 2023 (Zoology), arXiv:2312.04927, Sec. 3-4",
          "accuracy", ("softmax",), _FIXED_STATE),
    Claim("linear-time-faster",
          "Linear-time mechanisms train faster than dense softmax at the longest length.",
          "Tay et al. 2020, arXiv:2011.04006, Sec. 4.2 (Table 3, Figure 3)",
          "speed", _LINEAR_TIME, ("softmax",)),
    Claim("kernel-lowrank-window-faster",
          "Kernel (linear, Performer), low-rank (Linformer), window (local, sliding window) and latent (Perceiver) "
          "attention train faster than dense softmax at the longest length.",
          "Tay et al. 2020, arXiv:2011.04006, Table 3 (Performer, Linformer, Linear Transformer, Local fastest)",
          "speed", _LRA_FASTEST, ("softmax",)),
    Claim("chosen-blocks-recall",
          "With every fact beyond a sliding window's reach, NSA's and MoBA's data-chosen key blocks recall it as "
          "dense attention does; the sliding window cannot.",
          "Yuan et al. 2025, arXiv:2502.11089, Sec. 4.3 (needle retrieval at 64k); Lu et al. 2025, arXiv:2502.13189, "
          "Sec. 3.2 (long-context evaluation on par with full attention); Arora et al. 2023, arXiv:2312.04927, Sec. 3",
          "accuracy", ("softmax", *_CHOSEN), ("sliding-window",), ("associative_recall",)),
)


@dataclass
class Comparison:
    """One (better, worse) pair on one task: the interval of ``mean(better) - mean(worse)`` and the decision."""

    where: str
    better: str
    worse: str
    difference: float
    interval: tuple[float, float]
    outcome: str
    reason: str
    decide: str = ""  # for an undecided pair: the runs that would decide it (:func:`deciding_runs`)

    def text(self, measure: str) -> str:
        scale, unit = (100, " points") if measure == "accuracy" else (1, " steps/s")
        low, high = self.interval
        return (f"{self.where}: {self.better} - {self.worse} = {scale * self.difference:+.1f}{unit} "
                f"(95 % interval {scale * low:+.1f} to {scale * high:+.1f}): {self.outcome}"
                + (f" ({self.reason})" if self.reason else "")
                + (f"; would be decided by {self.decide}" if self.decide else ""))


@dataclass
class Verdict:
    """A claim checked against numbers: ``outcome`` (:data:`HELD`, :data:`NOT_HELD`, :data:`UNDECIDED`, or None:
    a mechanism it needs was not measured), the comparisons, and what was not measured."""

    claim: Claim
    outcome: str | None
    comparisons: list[Comparison] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def held(self) -> bool | None:
        """True (held), False (did not hold), None (undecided or not measured)."""
        return {HELD: True, NOT_HELD: False}.get(self.outcome)


def at_chance(values: list[float], chance: float) -> bool:
    """Whether accuracies ``values`` are within the noise of ``chance``: not :data:`NEAR_CHANCE` above it on
    average, or Welch's interval of their difference from it reaches 0."""
    w = welch(values, [chance], CONFIDENCE)
    return w.difference < NEAR_CHANCE or w.low <= 0


MOST_SEEDS = 20
"""Past this many seeds per mechanism, :func:`deciding_runs` calls a difference too small for seeds to decide."""


def deciding_runs(difference: float, interval: tuple[float, float], seeds: int, margin: float) -> str:
    """The seeds per mechanism at which an undecided difference would be decided, at the spread seen so far.

    Held needs the interval above 0, did-not-hold needs it below ``margin``: the nearer of the two
    asks for a half-width of ``max(difference, margin - difference)``. A half-width shrinks as
    ``1 / sqrt(seeds)`` (Welch's t, the t quantile held fixed), so ``seeds * (half / needed)^2`` seeds
    give it; more than :data:`MOST_SEEDS` says that seeds will not decide it.

    Example:
        >>> deciding_runs(0.10, (-0.05, 0.25), 3, 0.02)
        'more seeds: about 7 per mechanism at this spread'
    """
    half, needed = (interval[1] - interval[0]) / 2, max(difference, margin - difference)
    count = math.ceil(seeds * (half / needed) ** 2) if needed > 0 else MOST_SEEDS + 1
    if count > MOST_SEEDS:
        return (f"neither more seeds (over {MOST_SEEDS} per mechanism at this spread) nor a longer budget alone: the "
                "difference sits on the line the claim draws")
    return f"more seeds: about {max(count, seeds + 1)} per mechanism at this spread"


def compare(where: str, better: str, worse: str, a: list[float], b: list[float], *,
            chance: float | None = None) -> Comparison:
    """Decide ``better`` (values ``a``) above ``worse`` (values ``b``); ``chance``: accuracy's chance level.

    Example:
        >>> compare("t", "softmax", "local", [0.97, 0.95, 0.99], [0.26, 0.25, 0.24], chance=0.25).outcome
        'held'
        >>> compare("t", "softmax", "local", [0.27, 0.24, 0.26], [0.25, 0.26, 0.24], chance=0.25).reason
        'softmax is within the noise of chance'
    """
    w = welch(a, b, CONFIDENCE)
    interval = (w.low, w.high)
    if min(len(a), len(b)) < 2:
        return Comparison(where, better, worse, w.difference, interval, UNDECIDED, "one value has no spread to "
                                                                                   "weigh the difference against",
                          "more seeds: 3 or more per mechanism")
    if chance is not None and at_chance(a, chance):
        return Comparison(where, better, worse, w.difference, interval, UNDECIDED, f"{better} is within the noise "
                                                                                   f"of chance",
                          f"a longer budget (more steps, or the rates of --lr-sweep): {better} has not left chance, "
                          "and seeds of a model that has not learned decide nothing")
    margin = MARGIN if chance is not None else 0.0
    outcome = HELD if w.low > 0 else NOT_HELD if w.high < margin else UNDECIDED
    if outcome != UNDECIDED:
        return Comparison(where, better, worse, w.difference, interval, outcome, "")
    return Comparison(where, better, worse, w.difference, interval, outcome, "the difference is within the noise",
                      deciding_runs(w.difference, interval, min(len(a), len(b)), margin))


def _verdict(claim: Claim, comparisons: list[Comparison], missing: list[str]) -> Verdict:
    outcomes = {c.outcome for c in comparisons}
    if missing or not comparisons:
        outcome = None
    else:
        outcome = NOT_HELD if NOT_HELD in outcomes else HELD if outcomes == {HELD} else UNDECIDED
    return Verdict(claim, outcome, comparisons, missing)


def check(claim: Claim, accuracy: dict[tuple[str, str], list[float]], speed: dict[str, list[float]],
          chance: dict[str, float] | None = None) -> Verdict:
    """``claim`` against ``accuracy`` ((task, mechanism) -> per-seed accuracies), ``speed`` (mechanism -> per-step
    steps/s) and ``chance`` (task -> chance level); a task the claim reads with none of its mechanisms is skipped.

    Example:
        >>> acc = {("associative_recall", m): a for m, a in [("softmax", [0.96, 0.98, 0.97]),
        ...        ("linear", [0.5, 0.55, 0.52]), ("linformer", [0.3, 0.28, 0.31]), ("performer", [0.4, 0.42, 0.45])]}
        >>> check(CLAIMS[1], acc, {}, {"associative_recall": 0.25}).outcome
        'held'
    """
    chance = chance or {}
    wanted = (*claim.better, *claim.worse)
    if claim.measure == "speed":
        missing = [f"speed of {m}" for m in wanted if not speed.get(m)]
        pairs = [] if missing else [compare("at the longest length", b, w, speed[b], speed[w])
                                    for b in claim.better for w in claim.worse]
        return _verdict(claim, pairs, missing)
    comparisons, missing = [], []
    for task in claim.tasks:
        have = {m for (t, m), v in accuracy.items() if t == task and v}
        if not have & set(wanted):
            continue
        gaps = [m for m in wanted if m not in have]
        if gaps:
            missing += [f"{task}: {m}" for m in gaps]
            continue
        comparisons += [compare(task, b, w, accuracy[task, b], accuracy[task, w], chance=chance.get(task, 0.0))
                        for b in claim.better for w in claim.worse]
    return _verdict(claim, comparisons, missing)


def needed_pairs() -> tuple[tuple[str, str], ...]:
    """The (task, mechanism) pairs the accuracy claims compare on the default scale's tasks, task by task."""
    from .suite import plan

    tasks = plan().tasks
    pairs = [(t, m) for c in CLAIMS if c.measure == "accuracy" for t in c.tasks if t in tasks
             for m in (*c.better, *c.worse)]
    return tuple(dict.fromkeys(sorted(pairs, key=lambda pair: tasks.index(pair[0]))))


def needed_speed() -> tuple[str, ...]:
    """The mechanisms the speed claims compare (measured at the longest length)."""
    return tuple(dict.fromkeys(m for c in CLAIMS if c.measure == "speed" for m in (*c.better, *c.worse)))
