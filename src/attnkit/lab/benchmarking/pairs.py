"""Two callables computing the same thing, attnkit's and torch's, as a time ratio per interleaved round.

A :class:`Pair` is one row of the whole-model, dispatch-overhead and transformers
tables: :func:`measure` first checks that both sides return the same result, then
times them interleaved (:func:`attnkit.lab.analysis.timing.time_rounds`) and takes the
ratio in every round, so a change of load that hits one round hits both sides of it;
the row reports the ratios' median and range. :func:`table` renders the results.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..analysis.timing import time_rounds

__all__ = ["Pair", "measure", "table"]


@dataclass
class Pair:
    """A row: its ``name``, the ``goal`` (largest allowed ratio), both sides and what attnkit runs ``against``."""

    name: str
    goal: float
    ours: Callable[[], object]
    theirs: Callable[[], object]
    against: str


def measure(row: Pair, rounds: int, budget_s: float = 0.05, min_calls: int = 5, warmup: int = 0,
            device=None) -> dict:
    """Per round: both sides for about ``budget_s`` each (at least ``min_calls``; order alternating), the ratio.

    Before timing: one call of each side (their results must agree), then ``warmup`` more calls each.
    ``device``: where the sides compute (synchronised around each sample on CUDA).
    """
    torch.testing.assert_close(row.ours(), row.theirs(), rtol=1e-4, atol=1e-5)  # same function, first
    for _ in range(warmup):
        row.ours(), row.theirs()
    calls = min_calls
    if budget_s > 0:
        per_call = time_rounds({"theirs": row.theirs}, 1, 0, calls=3, device=device)["theirs"][0]
        calls = max(min_calls, int(budget_s / max(per_call, 1e-7)))
    times = time_rounds({"ours": row.ours, "theirs": row.theirs}, rounds, 0, calls=calls, device=device)
    ratios = [o / t for o, t in zip(times["ours"], times["theirs"], strict=True)]
    return {"name": row.name, "against": row.against, "goal": row.goal, "ratio": statistics.median(ratios),
            "lo": min(ratios), "hi": max(ratios), "ours_us": statistics.median(times["ours"]) * 1e6,
            "theirs_us": statistics.median(times["theirs"]) * 1e6}


def table(results: list[dict], unit: str = "µs") -> str:
    """The results as a Markdown table, times in ``unit`` ("µs" or "ms")."""
    per = {"µs": 1.0, "ms": 1e3}[unit]
    lines = [f"| row | against | attnkit {unit} | torch {unit} | ratio (median, range) | target | met |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        met = "yes" if r["ratio"] <= r["goal"] else "no"
        lines.append(f"| {r['name']} | {r['against']} | {r['ours_us'] / per:.1f} | {r['theirs_us'] / per:.1f} | "
                     f"{r['ratio']:.2f}x ({r['lo']:.2f}-{r['hi']:.2f}) | <= {r['goal']:.2f}x | {met} |")
    return "\n".join(lines)
