"""The tour report's section on recall against state size (:mod:`attnkit.lab.tour.experiments.recall`).

From the cached runs of those experiments (:data:`~attnkit.lab.tour.experiments.recall.KEYS`): a table
(mechanism x width: accuracy mean ± sample standard deviation over seeds, and the decoding state of
one layer for one sequence, from the layer's cost spec), a picture (accuracy against state bytes and
against width, Zoology's Fig. 2 in small) and the claim of
:data:`~attnkit.lab.tour.experiments.recall.CLAIM`, decided by Welch's t (:mod:`attnkit.lab.tour.welch`) on each seed's
accuracy averaged over the widths: held, did not hold, or undecided. Nothing here trains.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..experiments.recall import CLAIM, KEYS, MECHANISMS, state_bytes
from ..welch import Welch, verdict, welch
from . import Report

__all__ = ["Cell", "recall_cells", "claim_verdict", "recall_picture", "recall_markdown", "recall_html"]


@dataclass
class Cell:
    """One (mechanism, width): the accuracy of each seed, and the state of one layer (bytes, one sequence)."""

    mechanism: str
    width: int
    accuracy: dict[int, float] = field(default_factory=dict)
    state_bytes: int | None = None


def recall_cells(rep: Report, state=state_bytes) -> list[Cell]:
    """The finished runs of the experiment, one :class:`Cell` per mechanism and width, by mechanism then width;
    ``state(mechanism, width)`` gives each cell's state (default: the layer's cost spec)."""
    cells: dict[tuple[str, int], Cell] = {}
    for rec in rep.records:
        if rec["key"] not in KEYS or rec["status"] != "ok":
            continue
        name, width = rec["mechanism"].rsplit("-d", 1)
        cell = cells.setdefault((name, int(width)), Cell(name, int(width)))
        cell.accuracy[rec["seed"]] = float(rec["result"]["accuracy"])
    for cell in cells.values():
        cell.state_bytes = state(cell.mechanism, cell.width)
    order = {name: i for i, name in enumerate(MECHANISMS)}
    return sorted(cells.values(), key=lambda c: (order.get(c.mechanism, len(order)), c.width))


def _per_seed(cells: list[Cell], mechanism: str) -> list[float]:
    """Each seed's accuracy averaged over the widths, for the seeds every width of ``mechanism`` has."""
    mine = [c for c in cells if c.mechanism == mechanism]
    seeds = set.intersection(*(set(c.accuracy) for c in mine)) if mine else set()
    return [statistics.fmean(c.accuracy[s] for c in mine) for s in sorted(seeds)]


def claim_verdict(cells: list[Cell]) -> tuple[str, Welch | None, str]:
    """``(verdict, Welch or None, detail)`` of the claim; "not measured" without two seeds of each side."""
    better, worse = (_per_seed(cells, CLAIM[k]) for k in ("better", "worse"))
    widths = sorted({c.width for c in cells if c.mechanism in (CLAIM["better"], CLAIM["worse"])})
    if len(better) < 2 or len(worse) < 2:
        return "not measured", None, f"{CLAIM['better']}: {len(better)} seed(s), {CLAIM['worse']}: {len(worse)}"
    w = welch(better, worse)
    detail = (f"{CLAIM['better']} {100 * statistics.fmean(better):.1f} % against {CLAIM['worse']} "
              f"{100 * statistics.fmean(worse):.1f} % (each seed's mean over widths {', '.join(map(str, widths))}; "
              f"{len(better)} and {len(worse)} seeds): difference {100 * w.difference:+.1f} points, "
              f"{100 * w.confidence:.0f} % interval [{100 * w.low:+.1f}, {100 * w.high:+.1f}] (Welch's t = "
              f"{w.t:.2f}, df = {w.df:.1f})")
    return verdict(w), w, detail


def _fmt(values: list[float]) -> str:
    mean = 100 * statistics.fmean(values)
    return f"{mean:.1f}" + (f" ± {100 * statistics.stdev(values):.1f}" if len(values) > 1 else "")


def _table(cells: list[Cell]) -> list[list[str]]:
    rows = [["mechanism", "width", "state of one layer (bytes, one sequence)", "accuracy % (mean ± std)", "seeds"]]
    for c in cells:
        state = "-" if c.state_bytes is None else f"{int(c.state_bytes):,}"
        rows.append([c.mechanism, str(c.width), state, _fmt(list(c.accuracy.values())), str(len(c.accuracy))])
    return rows


def recall_picture(rep: Report, cells: list[Cell]) -> tuple[Path | None, list[str]]:
    """Accuracy against state bytes (log scale) and against width, mean over seeds with the seeds' range."""
    if not cells:
        return None, []
    try:
        from matplotlib.ticker import FuncFormatter

        from ...viz._style import series_styles
        from .plots import _figure, _save

        fig = _figure(10.5, 4.2)
        by_state, by_width = fig.subplots(1, 2)
        names = list(dict.fromkeys(c.mechanism for c in cells))
        for name, style in zip(names, series_styles(len(names)), strict=True):
            mine = [c for c in cells if c.mechanism == name and c.state_bytes]
            means = [100 * statistics.fmean(c.accuracy.values()) for c in mine]
            spread = [[m - 100 * min(c.accuracy.values()) for c, m in zip(mine, means, strict=True)],
                      [100 * max(c.accuracy.values()) - m for c, m in zip(mine, means, strict=True)]]
            for ax, xs in ((by_state, [c.state_bytes for c in mine]), (by_width, [c.width for c in mine])):
                ax.errorbar(xs, means, yerr=spread, capsize=3, markersize=5, linewidth=1.4, label=name, **style)
        for ax, label in ((by_state, "decoding state of one layer, one sequence (bytes)"), (by_width, "model width")):
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
            ax.set(xlabel=label, ylabel="MQAR accuracy % (mean, seeds' range)", ylim=(0, 102))
            ax.grid(True, alpha=0.25)
        by_width.set_xticks(sorted({c.width for c in cells}))
        by_width.minorticks_off()
        by_width.legend(fontsize=8, loc="lower right")
        fig.suptitle("recall against state size (Zoology, Arora et al. 2023)")
        return _save(fig, rep.out / "img" / "recall_state.png"), []
    except Exception as err:  # noted in the report
        return None, [f"recall picture: {type(err).__name__}: {err}"]


def _claim_lines(cells: list[Cell]) -> tuple[str, str]:
    result, _, detail = claim_verdict(cells)
    return f"Claim: {CLAIM['statement']} ({CLAIM['source']}): **{result}**.", detail


def recall_markdown(rep: Report) -> list[str]:
    """The section as Markdown lines (none when the experiment did not run)."""
    cells = recall_cells(rep)
    if not cells:
        return []
    claim, detail = _claim_lines(cells)
    table = _table(cells)
    lines = ["| " + " | ".join(row) + " |" for row in table]
    lines.insert(1, "|" + "---|" * len(table[0]))
    return ["## Recall against state size", "", "The picture is in [index.html](index.html) "
            "([img/recall_state.png](img/recall_state.png)).", "", *lines, "", claim, "", detail, ""]


def recall_html(rep: Report, notes: list[str], table, image) -> list[str]:
    """The section as HTML parts (none when the experiment did not run); ``table`` and ``image`` are the page's
    own writers (rows -> HTML, (path, alt) -> HTML), ``notes`` collects what could not be drawn."""
    import html

    cells = recall_cells(rep)
    if not cells:
        return []
    path, more = recall_picture(rep, cells)
    notes += more
    claim, detail = _claim_lines(cells)
    claim = html.escape(claim).replace("**", "<b>", 1).replace("**", "</b>", 1)
    return ["<h2>Recall against state size</h2>", image(path, "MQAR accuracy against state size"),
            table(_table(cells)), f"<p>{claim}</p>", f"<p>{html.escape(detail)}</p>"]
