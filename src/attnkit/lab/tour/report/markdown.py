"""The Markdown half of the tour report (``out/README.md``) and the facts both halves show."""

from __future__ import annotations

import datetime
import math
from pathlib import Path

from ..catalogue import LEFT_OUT, coverage_markdown, where_markdown
from . import TASK_PURPOSE, Report, Row, markdown_table
from .claims import claims_markdown
from .mad import mad_markdown
from .pieces import md_table
from .recall import recall_markdown
from .scaling import cost_table, scaling_markdown
from .state import state_markdown

__all__ = ["write_markdown", "run_info", "task_lines", "descriptions", "extra_rows"]


def descriptions() -> dict[str, str]:
    """Experiment key -> description, from ``attnkit.lab.tour.experiments()`` (empty if it cannot be loaded)."""
    from ..runner import api

    try:
        return {k: str(getattr(e, "description", "")) for k, e in api().experiments().items()}
    except Exception:  # the report must still be written when the experiments module is broken
        return {}


def task_lines(rows: list[Row]) -> list[tuple[str, str]]:
    """One ``(task, what it tests)`` per task in the table."""
    seen = {}
    desc = descriptions()
    for r in rows:
        if r.task not in seen:
            seen[r.task] = TASK_PURPOSE.get(r.task) or desc.get(r.key) or "(no description)"
    return list(seen.items())


def _duration(seconds) -> str:
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return "unknown (interrupted or still running)"
    minutes, secs = divmod(float(seconds), 60)
    return f"{int(minutes)} min {secs:.0f} s" if minutes else f"{secs:.1f} s"


def run_info(rep: Report) -> list[tuple[str, str]]:
    """How the tour was run: (label, value) pairs."""
    m = rep.manifest or {}
    mach = m.get("machine") or {}
    run_total = sum(r.get("wall_seconds") or 0.0 for r in rep.records)
    scaling = rep.scaling
    return [
        ("command", str(m.get("command", "unknown"))),
        ("mode", f"{m.get('mode', 'unknown')} ({len(m.get('keys', []))} experiments x seeds "
                 f"{', '.join(map(str, m.get('seeds', [])))})"),
        ("date", str(m.get("started", "unknown"))),
        ("machine", f"{mach.get('processor', '?')}, {mach.get('cpus', '?')} CPUs, {mach.get('platform', '?')}"),
        ("software", f"Python {mach.get('python', '?')}, torch {mach.get('torch', '?')}, "
                     f"attnkit {mach.get('attnkit', '?')} (code version {m.get('version', '?')})"),
        ("threads", str(mach.get("threads", "?"))),
        ("total time of the runs", _duration(run_total)),
        ("measured scaling time", _duration(scaling.get("seconds")) if scaling else "not measured"),
        ("last invocation", _duration(m.get("seconds"))),
        ("report written", datetime.datetime.now().astimezone().isoformat(timespec="seconds")),
    ]


def extra_rows(rows: list[Row]) -> list[list[str]]:
    """The extra metrics as strings (task, mechanism, metric, mean ± std), header first."""
    out = [["task", "mechanism", "metric", "mean ± std"]]
    for r in rows:
        for name, (mean, std) in r.extra.items():
            out.append([r.task, r.mechanism, name, f"{mean:.4g}" + ("" if std is None else f" ± {std:.2g}")])
    return out


def write_markdown(rep: Report) -> Path:
    """Write ``out/README.md``."""
    rows = rep.rows
    mode = (rep.manifest or {}).get("mode", "")
    text = [f"# attnkit tour{f' ({mode})' if mode else ''}", "",
            "Each mechanism trained on generated tasks, seeds as listed; accuracy is the task's test metric "
            "in percent, mean ± sample standard deviation over seeds. Pictures (learning curves, attention "
            "maps, cost and scaling) are in [index.html](index.html).", "", markdown_table(rows), ""]
    text += ["## What each task tests", ""] + [f"- **{t}**: {line}" for t, line in task_lines(rows)] + [""]
    desc = descriptions()
    if any(desc.get(r.key) for r in rows):
        text += ["## Experiments", ""] + [f"- `{r.key}`: {desc.get(r.key, '')}" for r in rows] + [""]
    extras = extra_rows(rows)
    if len(extras) > 1:
        text += ["## Extra metrics", ""] + md_table(extras) + [""]
    failed = [(r.key, s, e) for r in rows for s, e in r.failed.items()]
    if failed:
        text += ["## Failed runs", ""] + [f"- `{k}` seed {s}: {e}" for k, s, e in failed] + [""]
    if rep.costs:
        text += ["## Analytic cost at the tour's sizes (forward pass)", ""] + md_table(cost_table(rep.costs)) + [""]
    if rep.scaling and scaling_markdown(rep.scaling):
        text += ["## Measured scaling", "", scaling_markdown(rep.scaling), ""]
    elif rep.scaling and rep.scaling.get("error"):
        text += ["## Measured scaling", "", f"The measurement failed: {rep.scaling['error']}", ""]
    text += recall_markdown(rep)
    text += state_markdown(rep) + mad_markdown(rep) + claims_markdown(rep)
    text += ["## Registry entries the tour leaves out", ""] + [f"- **{k}**: {v}" for k, v in LEFT_OUT.items()] + [""]
    text += coverage_markdown() + where_markdown()
    text += ["## How it was run", ""] + [f"- {label}: {value}" for label, value in run_info(rep)]
    path = rep.out / "README.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path
