"""The tour report's section on state tracking against test length (:mod:`attnkit.lab.tour.experiments.state`).

From the cached runs of those experiments: a table (task x mechanism: accuracy at 4x the training length,
mean ± sample standard deviation over seeds, and the mean at each band of test lengths), a picture
(accuracy against test length, one panel per task) and :data:`~attnkit.lab.tour.experiments.state.CLAIM`,
decided by Welch's t (:mod:`attnkit.lab.tour.welch`) over seeds: the solving DeltaNet's accuracy against
the level (90 %), and chance plus the margin against the other DeltaNet's; held when both intervals lie
above 0, did not hold when either lies below, undecided otherwise. Nothing here trains.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from ..experiments.state import BANDS, CLAIM, MECHANISMS, NEGATIVE_BETA, TASKS, TRAIN_LENGTH
from ..welch import verdict, welch
from . import Report
from .recall import _fmt

__all__ = ["state_runs", "claim_verdict", "state_picture", "state_markdown", "state_html"]


def state_runs(rep: Report) -> dict[tuple[str, str], dict[int, dict]]:
    """``(task, mechanism) -> {seed: {"accuracy", "length_<L>" ...}}`` of the finished runs, in tour order."""
    runs: dict[tuple[str, str], dict[int, dict]] = {}
    for rec in rep.records:
        if rec["key"] in _ORDER and rec["status"] == "ok":
            result = rec["result"]
            runs.setdefault((rec["task"], rec["mechanism"]), {})[rec["seed"]] = {
                "accuracy": float(result["accuracy"]), **(result.get("extra") or {})}
    return dict(sorted(runs.items(), key=lambda item: _ORDER["/".join(item[0])]))


_ORDER = {f"{task}/{name}": i for i, (task, name) in enumerate((t, m) for t in TASKS for m in MECHANISMS)}


def claim_verdict(runs) -> tuple[str, str]:
    """``(verdict, detail)`` of the claim; "not measured" without two seeds of each DeltaNet."""
    task = CLAIM["task"]
    solves = [r["accuracy"] for r in runs.get((task, CLAIM["solves"]), {}).values()]
    fails = [r["accuracy"] for r in runs.get((task, CLAIM["fails"]), {}).values()]
    if len(solves) < 2 or len(fails) < 2:
        missing = "" if NEGATIVE_BETA else " (this DeltaNet has no allow_neg_eigval option: no beta in [0, 2])"
        return "not measured", f"{CLAIM['solves']}: {len(solves)} seed(s), {CLAIM['fails']}: {len(fails)}{missing}"
    ceiling = CLAIM["chance"] + CLAIM["margin"]
    above, near = welch(solves, [CLAIM["level"]]), welch([ceiling], fails)
    parts = [verdict(above), verdict(near)]
    result = ("held" if parts == ["held", "held"] else "did not hold" if "did not hold" in parts else "undecided")

    def text(w, what):
        return (f"{what}: {100 * w.difference:+.1f} points, {100 * w.confidence:.0f} % interval "
                f"[{100 * w.low:+.1f}, {100 * w.high:+.1f}] (t = {w.t:.2f}, df = {w.df:.1f}): {verdict(w)}")
    detail = (f"{CLAIM['solves']} {100 * statistics.fmean(solves):.1f} % over {len(solves)} seeds, "
              f"{CLAIM['fails']} {100 * statistics.fmean(fails):.1f} % over {len(fails)}; "
              + text(above, f"{CLAIM['solves']} minus {100 * CLAIM['level']:.0f} %") + "; "
              + text(near, f"{100 * ceiling:.0f} % (chance + {100 * CLAIM['margin']:.0f}) minus {CLAIM['fails']}"))
    return result, detail


def _table(runs) -> list[list[str]]:
    rows = [["task", "mechanism", "accuracy % at lengths 41-160 (mean ± std)", "seeds",
             *[f"length {lo + 1}-{hi} %" for lo, hi in zip((0, *BANDS), BANDS, strict=False)]]]
    for (task, mech), seeds in runs.items():
        bands = [statistics.fmean(r.get(f"length_{hi}", float("nan")) for r in seeds.values()) for hi in BANDS]
        rows.append([task, mech, _fmt([r["accuracy"] for r in seeds.values()]), str(len(seeds)),
                     *[f"{100 * b:.1f}" for b in bands]])
    return rows


def state_picture(rep: Report, runs) -> tuple[Path | None, list[str]]:
    """Accuracy against test length (each band's end), one panel per task, mean over seeds."""
    if not runs:
        return None, []
    try:
        from ...viz._style import series_styles
        from .plots import _figure, _save

        names = [t for t in TASKS if any(task == t for task, _ in runs)]
        fig = _figure(3.6 * len(names), 3.6)
        axes = fig.subplots(1, len(names), squeeze=False)[0]
        styles = dict(zip(MECHANISMS, series_styles(len(MECHANISMS)), strict=True))
        for ax, name in zip(axes, names, strict=True):
            for (task, mech), seeds in runs.items():
                if task == name:
                    ys = [100 * statistics.fmean(r.get(f"length_{hi}", float("nan")) for r in seeds.values())
                          for hi in BANDS]
                    ax.plot(BANDS, ys, label=mech, markersize=4, linewidth=1.3, **styles[mech])
            ax.axvline(BANDS[0], color="0.6", linewidth=0.8, linestyle=":")
            ax.set(title=name, xlabel="test length (end of band)", ylabel="accuracy %", ylim=(0, 102))
            ax.set_xscale("log", base=2)
            ax.grid(True, alpha=0.25)
        axes[-1].legend(fontsize=7, loc="lower left")
        fig.suptitle(f"state tracking: trained on length {TRAIN_LENGTH}, tested longer (Grazzi et al. 2025)")
        return _save(fig, rep.out / "img" / "state_tracking.png"), []
    except Exception as err:  # noted in the report
        return None, [f"state-tracking picture: {type(err).__name__}: {err}"]


def _claim_line(runs) -> tuple[str, str]:
    result, detail = claim_verdict(runs)
    return f"Claim: {CLAIM['statement']} ({CLAIM['source']}): **{result}**.", detail


def state_markdown(rep: Report) -> list[str]:
    """The section as Markdown lines (none when the experiment did not run)."""
    runs = state_runs(rep)
    if not runs:
        return []
    table = _table(runs)
    lines = ["| " + " | ".join(row) + " |" for row in table]
    lines.insert(1, "|" + "---|" * len(table[0]))
    claim, detail = _claim_line(runs)
    return ["## State tracking against test length", "", "The picture is in [index.html](index.html) "
            "([img/state_tracking.png](img/state_tracking.png)).", "", *lines, "", claim, "", detail, ""]


def state_html(rep: Report, notes: list[str], table, image) -> list[str]:
    """The section as HTML parts (none when the experiment did not run); ``table``, ``image`` as in
    :func:`attnkit.lab.tour.report.recall.recall_html`."""
    import html

    runs = state_runs(rep)
    if not runs:
        return []
    path, more = state_picture(rep, runs)
    notes += more
    claim, detail = _claim_line(runs)
    claim = html.escape(claim).replace("**", "<b>", 1).replace("**", "</b>", 1)
    return ["<h2>State tracking against test length</h2>", image(path, "accuracy against test length"),
            table(_table(runs)), f"<p>{claim}</p>", f"<p>{html.escape(detail)}</p>"]
