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

# Where a label may go, as (dx, dy) in units of its bubble's radius plus a gap: on the bubble first, then beside it.
_PLACES = [(0, 0), (0, 1), (0, -1), (1, 0), (-1, 0), (1, 1), (-1, 1), (1, -1), (-1, -1), (0, 2), (0, -2), (2, 0),
           (-2, 0), (2, 2), (-2, 2), (2, -2), (-2, -2)]


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
    areas = [60 + 1400 * (p.peak_bytes or 0) / top for p in pts]
    for p, area in zip(pts, areas, strict=True):
        ax.scatter([p.steps_per_second], [100 * p.accuracy], s=area, alpha=0.45, edgecolors="black", linewidths=0.6)
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
    _labels(fig, ax, pts, areas)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=96)
    return path


def _labels(fig, ax, pts: list[Point], areas: list[float]) -> None:
    """Each bubble's name and memory, on the bubble where it overlaps no other label and no other bubble's centre,
    else on the first such place around it (:data:`_PLACES`) with a thin line to the bubble; the largest bubbles
    are labelled first."""
    fig.canvas.draw()  # the layout and limits are final: label boxes are measured where they will be drawn
    renderer = fig.canvas.get_renderer()
    centres = [ax.transData.transform((p.steps_per_second, 100 * p.accuracy)) for p in pts]
    placed: list = []
    for i in sorted(range(len(pts)), key=lambda i: -areas[i]):
        p, radius = pts[i], math.sqrt(areas[i] / math.pi)  # points: scatter's s is an area in points^2
        label = p.mechanism + ("" if p.peak_bytes is None else f"\n{p.peak_bytes / 2**20:.0f} MiB")
        for n, (dx, dy) in enumerate(_PLACES):
            step = radius + 14.0
            text = ax.annotate(label, (p.steps_per_second, 100 * p.accuracy), xytext=(dx * step, dy * step),
                               textcoords="offset points", fontsize=8, ha="center", va="center",
                               arrowprops=None if n == 0 else {"arrowstyle": "-", "lw": 0.5, "color": "0.4",
                                                               "shrinkA": 0, "shrinkB": radius})
            box = text.get_window_extent(renderer).expanded(1.05, 1.1)
            covers = any(box.contains(*centre) for j, centre in enumerate(centres) if j != i)  # another's bubble
            if not (covers or any(box.overlaps(other) for other in placed)) or n == len(_PLACES) - 1:
                placed.append(box)
                break
            text.remove()
