"""The long-range suite's report: ``out/README.md`` and an offline ``out/index.html`` from the cached runs.

It reuses the default tour's report pieces (:func:`attnkit.tour.report.load_records` and
:func:`~attnkit.tour.report.summarize` for the per-pair rows, the HTML table and embedded-image
helpers, the run facts) and adds the suite's own: the LRA picture (:mod:`.picture`), the
task x mechanism table, the speed and memory table at the longest length, and the papers'
claims (:mod:`.claims`) with held / not held at this scale. Nothing here trains or measures.
"""

from __future__ import annotations

import html
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..report import Report, Row, cell, fmt_accuracy, load_manifest, load_records, summarize
from ..report.html import STYLE, _img, _table
from ..report.markdown import run_info
from .claims import CLAIMS, Verdict, check
from .picture import draw, points
from .roster import MECHANISMS
from .runner import load_speed
from .suite import TASKS

__all__ = ["LongReport", "load", "write", "accuracy_table", "speed_table", "verdicts"]


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


def load(out) -> LongReport:
    """The :class:`LongReport` of a suite folder (its last invocation's runs and speed measurements)."""
    out = Path(out)
    manifest = load_manifest(out)
    records = load_records(out, manifest)
    mode, version = (manifest or {}).get("mode", "default"), (manifest or {}).get("version")
    speed = {}
    for path in sorted((out / "runs" / mode).glob("speed__*.json")):
        rec = load_speed(path, mode=mode, version=version)
        if rec is not None and rec.get("status") == "ok":
            speed[rec["mechanism"]] = rec["result"]
    order = {m: i for i, m in enumerate(MECHANISMS)}
    speed = dict(sorted(speed.items(), key=lambda item: order.get(item[0], len(order))))
    return LongReport(out, manifest, records, summarize(records), speed)


def _mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def accuracy_table(rep: LongReport) -> list[list[str]]:
    """Mechanism x task accuracy (mean ± std over seeds), then the mean accuracy, steps/s, peak MiB, parameters."""
    task_names = list(dict.fromkeys(r.task for r in rep.rows))
    by = {(r.mechanism, r.task): r for r in rep.rows}
    out = [["mechanism", *task_names, "mean accuracy %", "steps/s (mean)", "peak MiB (mean)", "parameters"]]
    for mech in dict.fromkeys(r.mechanism for r in rep.rows):
        rows = [by[mech, t] for t in task_names if (mech, t) in by]
        ok = [r for r in rows if r.accuracy is not None]
        speeds = [r.extra["steps_per_second"][0] for r in ok if "steps_per_second" in r.extra]
        peaks = [r.peak_bytes for r in ok if r.peak_bytes is not None]
        params = sorted({r.parameters for r in ok if r.parameters is not None})
        out.append([mech, *[fmt_accuracy(by[mech, t]) if (mech, t) in by else "-" for t in task_names],
                    f"{100 * statistics.fmean(r.accuracy[0] for r in ok):.1f}" if ok else "-",
                    f"{statistics.fmean(speeds):.2f}" if speeds else "-",
                    _mib(statistics.fmean(peaks)) if peaks else "-",
                    " / ".join(f"{p:,}" for p in params) or "-"])
    return out


def speed_table(rep: LongReport) -> list[list[str]]:
    """Steps per second and peak memory at the longest length, and the speed relative to softmax."""
    base = rep.speed.get("softmax", {}).get("steps_per_second")
    out = [["mechanism", "length", "steps/s", "x softmax", "peak MiB"]]
    for mech, res in rep.speed.items():
        rel = "-" if not base else f"{res['steps_per_second'] / base:.2f}"
        out.append([mech, str(res["length"]), f"{res['steps_per_second']:.2f}", rel, _mib(res.get("peak_bytes"))])
    return out


def verdicts(rep: LongReport) -> list[Verdict]:
    """Each claim of :data:`.claims.CLAIMS` checked against this report's numbers."""
    accuracy: dict[tuple[str, str], list[float]] = {}
    for rec in rep.records:
        if rec["status"] == "ok":
            accuracy.setdefault((rec["task"], rec["mechanism"]), []).append(float(rec["result"]["accuracy"]))
    speed = {m: float(r["steps_per_second"]) for m, r in rep.speed.items()}
    return [check(claim, accuracy, speed) for claim in CLAIMS]


def _status(v: Verdict) -> str:
    return {True: "held", False: "did not hold at this scale", None: "not measured"}[v.held]


def _intro(rep: LongReport) -> list[str]:
    m = rep.manifest or {}
    budget = m.get("budget") or {}
    quick = rep.mode == "quick"
    lines = [("**This is a `--quick` report: a few training steps on short sequences, to check that everything "
              "runs. Its accuracies mean nothing.**") if quick else "",
             "Every long-sequence mechanism as the same encoder classifier (embedding, sinusoidal positions, "
             "pre-norm blocks, mean pooling, linear head) at matched parameter count, trained with the same budget "
             f"({budget.get('steps', '?')} steps, batch {budget.get('batch_size', '?')}, peak learning rate "
             f"{budget.get('lr', '?')}) on each task, seeds {', '.join(map(str, m.get('seeds', [])))}, one fresh "
             "process per (task, mechanism) at one thread. Accuracy is the test accuracy in percent, mean ± sample "
             "standard deviation over seeds; steps/s counts the training steps only; peak memory is the growth of "
             "the process's peak resident size while training.",
             "The picture is Long Range Arena's Figure 3 (Tay et al. 2020, arXiv:2011.04006) at this scale: "
             "accuracy (mean over tasks and seeds) against training speed, bubble area = peak memory. Lambda runs "
             "on the image tasks only, so its bubble averages those."]
    return [line for line in lines if line]


def _task_lines(rep: LongReport) -> list[tuple[str, str]]:
    names = dict.fromkeys(r.task for r in rep.rows)
    return [(t, TASKS[t].purpose if t in TASKS else "(not a suite task)") for t in names]


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
    speed_len = (rep.manifest or {}).get("speed_length")
    return facts + [("speed measurement", f"length {speed_len}, batch 4, 3 timed steps after one warm-up step")]


def _md(table: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(cell(c) for c in table[0]) + " |", "|" + "---|" * len(table[0])]
    return lines + ["| " + " | ".join(cell(c) for c in row) + " |" for row in table[1:]]


def _failed(rep: LongReport) -> list[tuple[str, int, str]]:
    return [(r.key, s, e) for r in rep.rows for s, e in r.failed.items()]


def write_markdown(rep: LongReport, picture: Path | None, note: str | None) -> Path:
    """Write ``out/README.md``."""
    text = [f"# attnkit tour --suite long ({rep.mode})", "", *[p + "\n" for p in _intro(rep)]]
    text += ["![accuracy vs speed, bubble = memory](img/lra.png)" if picture else f"(picture not drawn: {note})",
             "", "## Accuracy, speed and memory at each task's length", ""] + _md(accuracy_table(rep)) + [""]
    text += [f"## Speed and memory at length {(rep.manifest or {}).get('speed_length', '?')}", ""]
    text += _md(speed_table(rep)) if rep.speed else ["Not measured."]
    text += ["", "## The papers' claims at this scale", ""]
    for v in verdicts(rep):
        text += [f"- **{_status(v)}**: {v.claim.statement} ({v.claim.source}). {v.detail}"]
        text += [f"  - {f}" for f in v.failures]
    text += ["", "## What each task tests", ""] + [f"- **{t}**: {line}" for t, line in _task_lines(rep)]
    text += ["", "## Mechanisms", ""] + [f"- **{m.name}**: {m.paper}" for m in MECHANISMS.values()]
    if _failed(rep):
        text += ["", "## Failed runs", ""] + [f"- `{k}` seed {s}: {e}" for k, s, e in _failed(rep)]
    text += ["", "## How it was run", ""] + [f"- {k}: {v}" for k, v in _facts(rep)]
    path = rep.out / "README.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


def write_html(rep: LongReport, picture: Path | None, note: str | None) -> Path:
    """Write ``out/index.html``: one offline page, the picture embedded as a ``data:`` URI."""
    e = html.escape
    body = [f"<h1>attnkit tour --suite long ({e(rep.mode)})</h1>", *[f"<p>{e(p.strip('*'))}</p>" for p in _intro(rep)]]
    body.append(_img(picture, "accuracy vs speed, bubble = memory") if picture
                else f'<p class="note">Picture not drawn: {e(str(note))}</p>')
    body += ["<h2>Accuracy, speed and memory at each task's length</h2>", _table(accuracy_table(rep))]
    body.append(f"<h2>Speed and memory at length {e(str((rep.manifest or {}).get('speed_length', '?')))}</h2>")
    body.append(_table(speed_table(rep)) if rep.speed else '<p class="note">Not measured.</p>')
    body.append("<h2>The papers' claims at this scale</h2><ul>")
    for v in verdicts(rep):
        fails = "".join(f"<li>{e(f)}</li>" for f in v.failures)
        body.append(f"<li><b>{e(_status(v))}</b>: {e(v.claim.statement)} <span class=\"note\">({e(v.claim.source)})"
                    f"</span><br>{e(v.detail)}{f'<ul>{fails}</ul>' if fails else ''}</li>")
    body += ["</ul><h2>What each task tests</h2><ul>"]
    body += [f"<li><b>{e(t)}</b>: {e(line)}</li>" for t, line in _task_lines(rep)] + ["</ul>"]
    body += ["<h2>Mechanisms</h2><ul>"] + [f"<li><b>{e(m.name)}</b>: {e(m.paper)}</li>" for m in MECHANISMS.values()]
    body.append("</ul>")
    if _failed(rep):
        body += ["<h2>Failed runs</h2><ul>"]
        body += [f"<li><code>{e(k)}</code> seed {s}: <code>{e(x)}</code></li>" for k, s, x in _failed(rep)] + ["</ul>"]
    body += ["<h2>How it was run</h2><table>"]
    body += [f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _facts(rep)] + ["</table>"]
    page = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            "<title>attnkit tour --suite long</title>", f"<style>{STYLE}</style></head><body>", *body, "</body></html>"]
    path = rep.out / "index.html"
    path.write_text("\n".join(page) + "\n", encoding="utf-8")
    return path


def write(out) -> tuple[Path, Path]:
    """Write ``out/README.md`` and ``out/index.html`` from the cached runs; returns both paths."""
    rep = load(out)
    picture, note = _picture(rep)
    return write_markdown(rep, picture, note), write_html(rep, picture, note)
