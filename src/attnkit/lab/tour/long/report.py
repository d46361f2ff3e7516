"""The long-range suite's report: ``out/README.md`` and an offline ``out/index.html`` from the saved runs.

It reads the run store (:mod:`attnkit.lab.tour.store`), aggregates per pair with the default tour's
:func:`~attnkit.lab.tour.report.summarize`, and is made of the shared page pieces
(:mod:`attnkit.lab.tour.report.pieces`). Its own parts: the LRA picture (:mod:`.picture`), the
task x mechanism table with each task's chance level and ceiling, what each accuracy means
(learned, partly, at chance), the speed and memory table at the longest length, the learning
curves, the papers' claims decided by Welch's t-test (:mod:`.claims`), and the registry entries
the tour leaves out (:mod:`attnkit.lab.tour.catalogue`). Nothing here trains or measures.
"""

from __future__ import annotations

import html
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..catalogue import LEFT_OUT
from ..report import Report, Row, fmt_accuracy, summarize
from ..report.markdown import run_info
from ..report.pieces import html_image, html_table, md_table, write_page
from ..report.plots import curves
from ..store import load_manifest, load_records
from .claims import CLAIMS, CONFIDENCE, MARGIN, NEAR_CHANCE, Verdict, at_chance, check
from .picture import draw, points
from .roster import MECHANISMS
from .runner import load_speed
from .suite import TASKS

__all__ = ["LongReport", "load", "write", "accuracy_table", "speed_table", "verdicts", "standing", "LEARNED"]

LEARNED = 0.25
"""A mechanism learned a task when its accuracy is at least 25 points above chance."""


@dataclass
class LongReport:
    """Everything the suite's report shows, loaded once from the folder."""

    out: Path
    manifest: dict | None
    records: list[dict]
    rows: list[Row]
    speed: dict[str, dict]

    @property
    def mode(self) -> str:
        return (self.manifest or {}).get("mode", "default")

    def accuracies(self) -> dict[tuple[str, str], list[float]]:
        """(task, mechanism) -> the test accuracy of each finished seed."""
        out: dict[tuple[str, str], list[float]] = {}
        for rec in self.records:
            if rec["status"] == "ok":
                out.setdefault((rec["task"], rec["mechanism"]), []).append(float(rec["result"]["accuracy"]))
        return out

    def chance(self) -> dict[str, float]:
        """Task -> its chance level: the mean over runs of each test batch's most common label share."""
        found: dict[str, list[float]] = {}
        for rec in self.records:
            value = (rec.get("result") or {}).get("extra", {}).get("chance")
            if rec["status"] == "ok" and value is not None:
                found.setdefault(rec["task"], []).append(float(value))
        return {t: statistics.fmean(v) for t, v in found.items()}


def load(out) -> LongReport:
    """The :class:`LongReport` of a suite folder (its last invocation's runs and speed measurements)."""
    out = Path(out)
    manifest = load_manifest(out)
    records = load_records(out, manifest)
    mode, version = (manifest or {}).get("mode", "default"), (manifest or {}).get("version")
    speed = {}
    for path in sorted((out / "runs" / mode).glob("speed__*.json")):
        rec = load_speed(path, scale=mode, version=version)
        if rec is not None and rec.get("status") == "ok":
            speed[rec["mechanism"]] = rec["result"]
    order = {m: i for i, m in enumerate(MECHANISMS)}
    speed = dict(sorted(speed.items(), key=lambda item: order.get(item[0], len(order))))
    return LongReport(out, manifest, records, summarize(records), speed)


def _mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def standing(values: list[float], chance: float) -> str:
    """``"learned"`` (at least :data:`LEARNED` above chance), ``"at chance"`` (within the noise of it), or ``"partly"``.

    Example:
        >>> standing([0.97, 0.95], 0.25), standing([0.26, 0.24, 0.25], 0.25), standing([0.4, 0.42, 0.41], 0.25)
        ('learned', 'at chance', 'partly')
    """
    if at_chance(values, chance):
        return "at chance"
    return "learned" if statistics.fmean(values) - chance >= LEARNED else "partly"


def accuracy_table(rep: LongReport) -> list[list[str]]:
    """Mechanism x task accuracy (mean ± std over seeds; "≈" where it is at chance; after a learning-rate
    sweep, the best rate's factor, ``(lr x3)``), then the mean, steps/s, peak MiB and parameters; the second
    row gives each task's chance level and ceiling."""
    task_names = list(dict.fromkeys(r.task for r in rep.rows))
    by, accs, chance = {(r.mechanism, r.task): r for r in rep.rows}, rep.accuracies(), rep.chance()
    out = [["mechanism", *task_names, "mean accuracy %", "steps/s (mean)", "peak MiB (mean)", "parameters"],
           ["chance / ceiling", *[f"{100 * chance[t]:.1f} / 100" if t in chance else "- / 100" for t in task_names],
            "", "", "", ""]]
    for mech in dict.fromkeys(r.mechanism for r in rep.rows):
        rows = [by[mech, t] for t in task_names if (mech, t) in by]
        ok = [r for r in rows if r.accuracy is not None]
        speeds = [r.extra["steps_per_second"][0] for r in ok if "steps_per_second" in r.extra]
        peaks = [r.peak_bytes for r in ok if r.peak_bytes is not None]
        params = sorted({r.parameters for r in ok if r.parameters is not None})
        cells = []
        for t in task_names:
            if (mech, t) not in by:
                cells.append("-")
                continue
            flat = accs.get((t, mech)) and t in chance and standing(accs[t, mech], chance[t]) == "at chance"
            row = by[mech, t]
            rate = f" (lr x{row.lr_scale:.3g})" if row.lr_swept else ""  # after a sweep: the best rate's runs
            cells.append(("≈ " if flat else "") + fmt_accuracy(row) + rate)
        out.append([mech, *cells, f"{100 * statistics.fmean(r.accuracy[0] for r in ok):.1f}" if ok else "-",
                    f"{statistics.fmean(speeds):.2f}" if speeds else "-",
                    _mib(statistics.fmean(peaks)) if peaks else "-", " / ".join(f"{p:,}" for p in params) or "-"])
    return out


def _meaning(rep: LongReport) -> list[str]:
    """Per task: its chance level, its ceiling, and which mechanisms learned it, partly or not at all."""
    chance, accs, lines = rep.chance(), rep.accuracies(), []
    for task in dict.fromkeys(r.task for r in rep.rows):
        if task not in chance:
            continue
        groups: dict[str, list[str]] = {"learned": [], "partly": [], "at chance": []}
        for (t, mech), values in accs.items():
            if t == task:
                groups[standing(values, chance[task])].append(mech)
        parts = [f"{name}: {', '.join(ms)}" for name, ms in groups.items() if ms]
        lines.append(f"{task}: chance {100 * chance[task]:.1f} % (always the most common label), ceiling 100 % "
                     f"(the exact solver); " + "; ".join(parts))
    return lines


def speed_table(rep: LongReport) -> list[list[str]]:
    """Steps per second (mean ± std over the timed steps) and peak memory at the longest length, and x softmax."""
    base = rep.speed.get("softmax", {}).get("steps_per_second")
    out = [["mechanism", "length", "steps/s", "x softmax", "peak MiB"]]
    for mech, res in rep.speed.items():
        rates = [1 / s for s in res.get("step_seconds") or [] if s > 0]
        spread = f" ± {statistics.stdev(rates):.2f}" if len(rates) > 1 else ""
        rel = "-" if not base else f"{res['steps_per_second'] / base:.2f}"
        out.append([mech, str(res["length"]), f"{res['steps_per_second']:.2f}{spread}", rel,
                    _mib(res.get("peak_bytes"))])
    return out


def verdicts(rep: LongReport) -> list[Verdict]:
    """Each claim of :data:`.claims.CLAIMS` decided on this report's numbers."""
    speed = {m: [1 / s for s in r.get("step_seconds") or [] if s > 0] or [float(r["steps_per_second"])]
             for m, r in rep.speed.items()}
    return [check(claim, rep.accuracies(), speed, rep.chance()) for claim in CLAIMS]


def _status(v: Verdict) -> str:
    return v.outcome if v.outcome is not None else "not measured"


def _verdict_lines(v: Verdict) -> list[str]:
    return [c.text(v.claim.measure) for c in v.comparisons] + [f"not measured: {m}" for m in v.missing]


def _intro(rep: LongReport) -> list[str]:
    m = rep.manifest or {}
    budgets = m.get("budgets") or {}
    runs = "; ".join(f"{t}: {b.get('steps', '?')} steps of batch {b.get('batch_size', '?')}, peak learning rate "
                     f"{b.get('lr', '?')}" for t, b in budgets.items())
    lines = [("**This is a `--quick` report: a few training steps on toy sizes, to check that everything runs. "
              "Its accuracies mean nothing.**") if rep.mode == "quick" else "",
             "Every long-sequence mechanism as the same encoder (embedding, sinusoidal positions, pre-norm blocks, "
             "a linear head on every labelled position, or on the mean over positions) at matched parameter count, "
             f"trained with the same budget per task ({runs or 'see tour.json'}), warm-up then cosine decay, one "
             f"fresh process per (task, mechanism) at one thread, {m.get('workers', 1)} at once, on "
             f"{m.get('device', 'cpu')}. Accuracy is the test accuracy in percent, mean ± sample standard deviation "
             "over seeds; \"≈\" marks an accuracy within the noise of chance. steps/s counts the training steps "
             "only; peak memory is the growth of the process's peak resident size while it trained.",
             "The picture is Long Range Arena's Figure 3 (Tay et al. 2020, arXiv:2011.04006) at this scale: "
             "accuracy (mean over the tasks a mechanism ran, and seeds) against training speed, bubble area = peak "
             "memory. Mechanisms that ran on fewer tasks (the retrieval task trains the claims' mechanisms only, "
             "NSA and MoBA run on it alone, Lambda runs on images only) average those."]
    return [line for line in lines if line]


def _claims_note() -> str:
    return (f"Each ordering is decided by Welch's t-test on the difference of means over seeds (over timed steps for "
            f"speed): held when its {100 * CONFIDENCE:.0f} % interval lies above 0, did not hold when it lies below "
            f"{100 * MARGIN:.0f} points (below 0 for speed), undecided when the interval holds both, or when the "
            f"mechanism said to be better is less than {100 * NEAR_CHANCE:.0f} points above chance or within the "
            f"noise of it. An undecided pair names the runs that would decide it: a longer budget when the "
            f"better mechanism has not left chance, else about how many seeds its spread asks for. Longformer's "
            f"global tokens are each task's question tokens (the queries of the recall, the object pixels of the "
            f"legend, the marks of the byte documents), as its paper places them; a task without any (one label "
            f"per sequence) gets the first position as a class token.")


def _picture(rep: LongReport) -> tuple[Path | None, str | None]:
    pts = points(rep.rows)
    if not pts:
        return None, "no finished run to draw"
    title = f"Long-range suite ({rep.mode}): accuracy vs speed, bubble = peak memory"
    try:
        return draw(pts, rep.out / "img" / "lra.png", title=title), None
    except Exception as err:  # a picture that cannot be drawn is noted, the report goes on
        return None, f"{type(err).__name__}: {err}"


def _facts(rep: LongReport) -> list[tuple[str, str]]:
    facts = [(k, v) for k, v in run_info(Report(rep.out, rep.manifest, rep.records, rep.rows, [], None))
             if k != "measured scaling time"]
    m = rep.manifest or {}
    return facts + [("speed measurement", f"length {m.get('speed_length', '?')}, one warm-up step, then each timed "
                                          f"step on its own")]


def _failed(rep: LongReport) -> list[tuple[str, int, str]]:
    return [(r.key, s, e) for r in rep.rows for s, e in r.failed.items()]


def _sections(rep: LongReport) -> list[tuple[str, list[str], list[list[str]] | None]]:
    """The report's sections in order: (title, lines, table or None); both pages write these."""
    speed_len = (rep.manifest or {}).get("speed_length", "?")
    claims = [f"**{_status(v)}**: {v.claim.statement} ({v.claim.source})" + "".join(f"\n  - {d}" for d in
                                                                                  _verdict_lines(v))
              for v in verdicts(rep)]
    sections = [
        ("Accuracy, speed and memory at each task's length", [], accuracy_table(rep)),
        ("What the accuracies mean", _meaning(rep), None),
        (f"Speed and memory at length {speed_len}", [] if rep.speed else ["Not measured."],
         speed_table(rep) if rep.speed else None),
        ("The papers' claims at this scale", [_claims_note(), *claims], None),
        ("What each task tests", [f"**{t}**: {TASKS[t].purpose if t in TASKS else '(not a suite task)'}"
                                  for t in dict.fromkeys(r.task for r in rep.rows)], None),
        ("Mechanisms", [f"**{m.name}**: {m.paper}" for m in MECHANISMS.values()], None),
        ("Registry entries the tour leaves out", [f"**{k}**: {v}" for k, v in LEFT_OUT.items()], None),
    ]
    if _failed(rep):
        sections.append(("Failed runs", [f"`{k}` seed {s}: {e}" for k, s, e in _failed(rep)], None))
    return sections + [("How it was run", [f"{k}: {v}" for k, v in _facts(rep)], None)]


def write_markdown(rep: LongReport, picture: Path | None, note: str | None, curve_pictures) -> Path:
    """Write ``out/README.md``."""
    text = [f"# attnkit tour --suite long ({rep.mode})", "", *[p + "\n" for p in _intro(rep)]]
    text += ["![accuracy vs speed, bubble = memory](img/lra.png)" if picture else f"(picture not drawn: {note})", ""]
    for title, lines, table in _sections(rep):
        text += [f"## {title}", ""] + (md_table(table) + [""] if table else []) + [f"- {line}" for line in lines]
        text += [""]
    text += ["## Learning curves", ""] + [f"![{t}]({p.relative_to(rep.out).as_posix()})" for t, p in curve_pictures]
    path = rep.out / "README.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


def write_html(rep: LongReport, picture: Path | None, note: str | None, curve_pictures) -> Path:
    """Write ``out/index.html``: one offline page, the pictures embedded as ``data:`` URIs."""
    e = html.escape
    body = [f"<h1>attnkit tour --suite long ({e(rep.mode)})</h1>", *[f"<p>{e(p.strip('*'))}</p>" for p in _intro(rep)]]
    body.append(html_image(picture, "accuracy vs speed, bubble = memory") if picture
                else f'<p class="note">Picture not drawn: {e(str(note))}</p>')
    for title, lines, table in _sections(rep):
        body.append(f"<h2>{e(title)}</h2>")
        if table:
            body.append(html_table(table))
        if lines:
            items = "".join("<li>" + "<br>".join(e(part.replace("**", "")) for part in line.split("\n  - "))
                            + "</li>" for line in lines)
            body.append(f"<ul>{items}</ul>")
    body += ["<h2>Learning curves</h2>"] + [html_image(p, f"learning curves: {t}") for t, p in curve_pictures]
    return write_page(rep.out / "index.html", "attnkit tour --suite long", body)


def write(out) -> tuple[Path, Path]:
    """Write ``out/README.md`` and ``out/index.html`` from the saved runs; returns both paths."""
    rep = load(out)
    picture, note = _picture(rep)
    curve_pictures, _ = curves(rep)  # a curve that cannot be drawn is left out, as the picture is
    return write_markdown(rep, picture, note, curve_pictures), write_html(rep, picture, note, curve_pictures)
