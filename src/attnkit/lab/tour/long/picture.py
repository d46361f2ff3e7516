"""The LRA picture: accuracy against training speed, bubble size = peak memory, one labelled bubble per mechanism.

Tay et al. 2020, arXiv:2011.04006, Figure 3 ("Performance (y axis), speed (x axis), and memory
footprint (size of the circles)"). Here: y = test accuracy, mean over the tasks a mechanism ran and
their seeds; x = training steps per second at each task's length, mean over those tasks; bubble area
proportional to the peak memory, mean over them. A mechanism that ran on fewer tasks (the retrieval
task trains the claims' mechanisms only, Lambda runs on images only) is averaged over those, which
the report says.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Point", "points", "draw"]


@dataclass
class Point:
    """One bubble: a mechanism's mean accuracy, steps per second and peak bytes over ``tasks``."""

    mechanism: str
    accuracy: float
    steps_per_second: float
    peak_bytes: float | None
    tasks: int


def points(rows) -> list[Point]:
    """One :class:`Point` per mechanism from the report's rows (:func:`attnkit.lab.tour.report.summarize`)."""
    by_mech: dict[str, list] = {}
    for row in rows:
        if row.accuracy is not None and "steps_per_second" in row.extra:
            by_mech.setdefault(row.mechanism, []).append(row)
    out = []
    for mech, rows_ in by_mech.items():
        peaks = [r.peak_bytes for r in rows_ if r.peak_bytes is not None]
        out.append(Point(mech, statistics.fmean(r.accuracy[0] for r in rows_),
                         statistics.fmean(r.extra["steps_per_second"][0] for r in rows_),
                         statistics.fmean(peaks) if peaks else None, len(rows_)))
    return out


def draw(pts: list[Point], path: Path, *, title: str) -> Path:
    """Write the picture to ``path`` (PNG); raises ImportError without matplotlib."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FormatStrFormatter

    fig = Figure(figsize=(8.5, 5.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    peaks = [p.peak_bytes for p in pts if p.peak_bytes]
    top = max(peaks) if peaks else 1.0
    for p in pts:
        area = 60 + 1400 * (p.peak_bytes or 0) / top
        ax.scatter([p.steps_per_second], [100 * p.accuracy], s=area, alpha=0.45, edgecolors="black", linewidths=0.6)
        label = p.mechanism + ("" if p.peak_bytes is None else f"\n{p.peak_bytes / 2**20:.0f} MiB")
        ax.annotate(label, (p.steps_per_second, 100 * p.accuracy), fontsize=8, ha="center", va="center")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(FormatStrFormatter("%g"))
    ax.set_xlabel("training steps per second (1 thread, mean over tasks; log scale)")
    ax.set_ylabel("test accuracy % (mean over tasks and seeds)")
    ax.set_title(title)
    if pts:
        low = min(100 * p.accuracy for p in pts)
        high = max(100 * p.accuracy for p in pts)
        pad = max(2.0, (high - low) * 0.15)
        ax.set_ylim(low - pad, high + pad)
        xs = [p.steps_per_second for p in pts]
        if all(math.isfinite(x) and x > 0 for x in xs):
            ax.set_xlim(min(xs) / 1.4, max(xs) * 1.4)
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=96)
    return path
