"""The tour report's MAD section (:mod:`attnkit.lab.tour.experiments.mad`): one table and one picture.

From the cached runs of the MAD experiments: per mechanism, the accuracy on each of the six tasks (mean over
seeds) and their mean, the score Poli et al. 2024 rank architectures by; a heat map of the same numbers; and
:data:`~attnkit.lab.tour.experiments.mad.CLAIM` decided by Welch's t (:mod:`attnkit.lab.tour.welch`) of the
seeds' accuracy against the level (one seed, the suite's default on a CPU: read against the level, with no
interval). Nothing here trains.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from ...tasks.mad import MAD_TASKS
from ..experiments.mad import CLAIM, KEYS, MECHANISMS
from ..welch import verdict, welch
from . import Report

__all__ = ["mad_scores", "claim_verdict", "seeds_note", "mad_table", "mad_picture", "mad_markdown", "mad_html"]

_TASKS = list(MAD_TASKS)


def mad_scores(rep: Report) -> dict[str, dict[str, list[float]]]:
    """``mechanism -> task -> [accuracy of each seed]`` of the finished MAD runs, mechanisms in roster order."""
    found: dict[str, dict[str, list[float]]] = {}
    for rec in sorted(rep.records, key=lambda r: r["seed"]):
        if rec["key"] in KEYS and rec["status"] == "ok":
            found.setdefault(rec["mechanism"], {}).setdefault(rec["task"], []).append(float(rec["result"]["accuracy"]))
    return {m: found[m] for m in MECHANISMS if m in found}


def claim_verdict(scores) -> tuple[str, str]:
    """``(verdict, detail)``: the claim's mechanism's seeds against its level by Welch's t; one seed (the CPU
    default) is read against the level directly, "held on one seed" or "did not hold on one seed", with no
    interval; "not measured" without a run."""
    seeds = scores.get(CLAIM["mechanism"], {}).get(CLAIM["task"], [])
    name, level = f"{CLAIM['mechanism']} on {CLAIM['task']}", 100 * CLAIM["level"]
    if not seeds:
        return "not measured", f"{name}: no finished run"
    if len(seeds) == 1:
        held = "held" if seeds[0] >= CLAIM["level"] else "did not hold"
        return f"{held} on one seed", (f"{name}: {100 * seeds[0]:.1f} % on one seed against {level:.0f} %: no "
                                       f"interval (three seeds, --seeds 0 1 2, decide it by Welch's t)")
    w = welch(seeds, [CLAIM["level"]])
    return verdict(w), (f"{CLAIM['mechanism']} {100 * statistics.fmean(seeds):.1f} % over {len(seeds)} seeds, "
                        f"minus {level:.0f} %: {100 * w.difference:+.1f} points, "
                        f"{100 * w.confidence:.0f} % interval [{100 * w.low:+.1f}, {100 * w.high:+.1f}] "
                        f"(t = {w.t:.2f}, df = {w.df:.1f})")


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def mad_table(scores) -> list[list[str]]:
    """Rows: mechanism, each task's mean accuracy % over seeds, the mean over the six tasks (blank until all ran)."""
    rows = [["mechanism", *_TASKS, "mean", "seeds"]]
    for mech, by_task in scores.items():
        means = [_mean(by_task.get(t, [])) for t in _TASKS]
        whole = statistics.fmean(means) if not any(math.isnan(m) for m in means) else math.nan
        cells = ["-" if math.isnan(m) else f"{100 * m:.1f}" for m in (*means, whole)]
        rows.append([mech, *cells, str(max(len(v) for v in by_task.values()))])
    return rows


def mad_picture(rep: Report, scores) -> tuple[Path | None, list[str]]:
    """A heat map: mechanisms x (the six tasks and the mean), accuracy % written in each cell."""
    if not scores:
        return None, []
    try:
        from .plots import _figure, _save

        table = mad_table(scores)
        values = [[math.nan if c == "-" else float(c) for c in row[1:-1]] for row in table[1:]]
        fig = _figure(8.5, 0.45 * len(values) + 1.8)
        ax = fig.subplots()
        image = ax.imshow(values, vmin=0, vmax=100, cmap="viridis", aspect="auto")
        ax.set_xticks(range(len(table[0]) - 2), table[0][1:-1], rotation=30, ha="right")
        ax.set_yticks(range(len(values)), [row[0] for row in table[1:]])
        for i, row in enumerate(values):
            for j, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=7, color="white" if v < 60 else "k")
        fig.colorbar(image, ax=ax, label="accuracy %")
        ax.set_title("MAD (Poli et al. 2024): accuracy per task and mechanism")
        return _save(fig, rep.out / "img" / "mad.png"), []
    except Exception as err:  # noted in the report
        return None, [f"MAD picture: {type(err).__name__}: {err}"]


def seeds_note(scores) -> str:
    """A sentence on the seeds behind the table: one seed (the CPU default) is said in words; more say nothing."""
    most = max((len(v) for by_task in scores.values() for v in by_task.values()), default=0)
    return ("One seed per run (the suite's default on a CPU): the spread over seeds is not measured; "
            "--seeds 0 1 2 trains three." if most == 1 else "")


def mad_markdown(rep: Report) -> list[str]:
    """The section as Markdown lines (none when no MAD experiment ran)."""
    scores = mad_scores(rep)
    if not scores:
        return []
    table = mad_table(scores)
    lines = ["| " + " | ".join(row) + " |" for row in table]
    lines.insert(1, "|" + "---|" * len(table[0]))
    result, detail = claim_verdict(scores)
    note = seeds_note(scores)
    return ["## MAD: every token mixer on the six tasks", "", "The picture is in [index.html](index.html) "
            "([img/mad.png](img/mad.png)); accuracy %, mean over seeds." + (f" {note}" if note else ""), "", *lines, "",
            f"Claim: {CLAIM['statement']} ({CLAIM['source']}): **{result}**.", "", detail, ""]


def mad_html(rep: Report, notes: list[str], table, image) -> list[str]:
    """The section as HTML parts (none when no MAD experiment ran); ``table``, ``image`` as in
    :func:`attnkit.lab.tour.report.recall.recall_html`."""
    import html

    scores = mad_scores(rep)
    if not scores:
        return []
    path, more = mad_picture(rep, scores)
    notes += more
    result, detail = claim_verdict(scores)
    claim = f"Claim: {html.escape(CLAIM['statement'])} ({html.escape(CLAIM['source'])}): <b>{result}</b>."
    return ["<h2>MAD: every token mixer on the six tasks</h2>", image(path, "MAD accuracy per task and mechanism"),
            table(mad_table(scores)), *([f"<p>{html.escape(seeds_note(scores))}</p>"] if seeds_note(scores) else []),
            f"<p>{claim}</p>", f"<p>{html.escape(detail)}</p>"]
