"""The papers' orderings on the long-range suite, written once as data and checked against measured numbers.

The report shows each :class:`Claim` as held or not held at this scale, with the numbers, and
the slow test (``tests/tour/long/test_claims.py``) trains the subset a claim needs for three seeds
and asserts the claims marked ``reproduces``: the ones this suite's scale does show. Mechanism
groups come from the roster's flags (:mod:`.roster`), so a new mechanism joins its claims.

A claim compares two groups of mechanisms on one measure: ``"accuracy"`` on every retrieval-style
task of the suite (:attr:`.suite.SuiteTask.retrieval`), or ``"speed"`` (training steps per second at
the longest length, :mod:`.speed`). It holds when every mechanism of ``better`` is above every
mechanism of ``worse``; for accuracy, on each retrieval task and over all seeds: the worst seed of
the better mechanism above the best seed of the worse one, so that seed noise around chance level
never counts as an ordering.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from .roster import MECHANISMS
from .suite import TASKS

__all__ = ["Claim", "Verdict", "CLAIMS", "check", "needed_pairs", "needed_speed", "RETRIEVAL_TASKS"]

RETRIEVAL_TASKS = tuple(t.name for t in TASKS.values() if t.retrieval)
_GLOBAL = tuple(m.name for m in MECHANISMS.values() if m.global_tokens)
_LOCAL = tuple(m.name for m in MECHANISMS.values() if m.local_only)
_FIXED_STATE = tuple(m.name for m in MECHANISMS.values() if m.fixed_state)
_LINEAR_TIME = tuple(m.name for m in MECHANISMS.values() if m.linear_time and not m.images_only)
_LRA_FASTEST = (*_FIXED_STATE, *_LOCAL, "perceiver")  # kernel, low-rank, window and latent: no n x n work at all


@dataclass(frozen=True)
class Claim:
    """A stated ordering: ``better`` above ``worse`` on ``measure``; ``reproduces``: the slow test asserts it."""

    key: str
    statement: str
    source: str
    measure: str
    better: tuple[str, ...]
    worse: tuple[str, ...]
    reproduces: bool


CLAIMS: tuple[Claim, ...] = (
    Claim("global-beats-local",
          "On retrieval-style tasks, dense attention and global-token mechanisms (Longformer, BigBird) beat "
          "local and sliding-window attention.",
          "Tay et al. 2020, arXiv:2011.04006, Sec. 4 (Table 1, Retrieval); Beltagy et al. 2020; Zaheer et al. 2020",
          "accuracy", ("softmax", *_GLOBAL), _LOCAL, reproduces=False),
    Claim("fixed-state-behind-softmax",
          "Linformer, Performer and linear attention fall behind softmax on exact recall.",
          "Arora et al. 2023 (Zoology), arXiv:2312.04927, Sec. 3-4",
          "accuracy", ("softmax",), _FIXED_STATE, reproduces=False),
    Claim("linear-time-faster",
          "Linear-time mechanisms train faster than dense softmax at the longest length.",
          "Tay et al. 2020, arXiv:2011.04006, Sec. 4.2 (Table 3, Figure 3)",
          "speed", _LINEAR_TIME, ("softmax",), reproduces=False),
    Claim("kernel-lowrank-window-faster",
          "Kernel (linear, Performer), low-rank (Linformer), window (local, sliding window) and latent (Perceiver) "
          "attention train faster than dense softmax at the longest length.",
          "Tay et al. 2020, arXiv:2011.04006, Table 3 (Performer, Linformer, Linear Transformer, Local fastest)",
          "speed", _LRA_FASTEST, ("softmax",), reproduces=True),
)


@dataclass
class Verdict:
    """A claim checked against numbers: ``held`` (None: a mechanism it needs was not measured) and the evidence."""

    claim: Claim
    held: bool | None
    detail: str
    failures: list[str]


def _fmt(measure: str, values: list[float]) -> str:
    if measure != "accuracy":
        return f"{values[0]:.2f} steps/s"
    mean = 100 * statistics.fmean(values)
    return f"{mean:.1f} %" if len(values) == 1 else f"{mean:.1f} % ({100 * min(values):.1f}-{100 * max(values):.1f})"


def _compare(claim: Claim, values: dict[str, list[float]], where: str) -> tuple[bool | None, str, list[str]]:
    missing = [m for m in (*claim.better, *claim.worse) if not values.get(m)]
    if missing:
        return None, f"{where}: not measured: {', '.join(missing)}", []
    failures = [f"{b} ({_fmt(claim.measure, values[b])}) not above {w} ({_fmt(claim.measure, values[w])})"
                for b in claim.better for w in claim.worse if not min(values[b]) > max(values[w])]
    shown = "; ".join(f"{m} {_fmt(claim.measure, values[m])}" for m in (*claim.better, *claim.worse))
    return not failures, f"{where}: {shown}", [f"{where}: {f}" for f in failures]


def check(claim: Claim, accuracy: dict[tuple[str, str], list[float]], speed: dict[str, float]) -> Verdict:
    """``claim`` against ``accuracy`` ((task, mechanism) -> per-seed accuracies) and ``speed`` (mechanism -> steps/s).

    Example:
        >>> acc = {("byte_retrieval", m): a for m, a in [("softmax", [0.9, 0.8]), ("linear", [0.6, 0.7]),
        ...                                               ("linformer", [0.7, 0.75]), ("performer", [0.5, 0.5])]}
        >>> check(CLAIMS[1], acc, {}).held
        True
        >>> acc["byte_retrieval", "linformer"] = [0.7, 0.85]  # one seed above softmax's worst: not an ordering
        >>> check(CLAIMS[1], acc, {}).failures
        ['byte_retrieval: softmax (85.0 % (80.0-90.0)) not above linformer (77.5 % (70.0-85.0))']
    """
    if claim.measure == "speed":
        held, detail, failures = _compare(claim, {m: [v] for m, v in speed.items()}, "at the longest length")
        return Verdict(claim, held, detail, failures)
    parts, fails, helds = [], [], []
    for task in RETRIEVAL_TASKS:
        held, detail, failures = _compare(claim, {m: v for (t, m), v in accuracy.items() if t == task}, task)
        helds.append(held)
        parts.append(detail)
        fails += failures
    held = None if not helds or None in helds else all(helds)
    return Verdict(claim, held, " | ".join(parts), fails)


def needed_pairs() -> tuple[tuple[str, str], ...]:
    """The (task, mechanism) pairs the accuracy claims compare (the slow test trains these)."""
    names = dict.fromkeys(m for c in CLAIMS if c.measure == "accuracy" for m in (*c.better, *c.worse))
    return tuple((t, m) for t in RETRIEVAL_TASKS for m in names)


def needed_speed() -> tuple[str, ...]:
    """The mechanisms the speed claims compare (the slow test measures these at the longest length)."""
    return tuple(dict.fromkeys(m for c in CLAIMS if c.measure == "speed" for m in (*c.better, *c.worse)))
