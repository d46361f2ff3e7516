"""The tour report's pictures, all written under ``out/img/`` (and the interactive map pages under ``out/maps/``).

Every function returns what it wrote plus the reasons for what it could not draw, so a
broken map or a missing matplotlib leaves a note in the report instead of no report.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

import torch

from ..store import slug
from . import Report

__all__ = ["curves", "attention_maps", "cost_plot", "scaling_picture", "as_maps", "PLOT_LENGTHS"]

PLOT_LENGTHS = (256, 512, 1024, 2048, 4096)
MAX_EXAMPLES = 2


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=96)
    return path


def _mean_curve(curves: list, column: int) -> tuple[list[float], list[float]]:
    """Mean over seeds of one curve column at each step (points that are None or NaN are skipped)."""
    by_step = defaultdict(list)
    for curve in curves:
        for point in curve or []:
            value = point[column] if len(point) > column else None
            if isinstance(value, (int, float)) and math.isfinite(value):
                by_step[point[0]].append(float(value))
    steps = sorted(by_step)
    return steps, [statistics.fmean(by_step[s]) for s in steps]


def curves(rep: Report) -> tuple[list[tuple[str, Path]], list[str]]:
    """One PNG per task: training loss and evaluation accuracy against step, mean over seeds, per mechanism."""
    by_task: defaultdict[str, defaultdict[str, list]] = defaultdict(lambda: defaultdict(list))
    for rec in rep.records:
        if rec["status"] == "ok":
            by_task[rec["task"]][rec["mechanism"]].append(rec["result"].get("curve"))
    from ...viz._style import series_styles

    written, notes = [], []
    for task, mechs in by_task.items():
        try:
            # one legend for both panels, beside them: it never covers the last steps; a wider figure for many series
            fig = _figure(11.6, 3.6 + max(0.0, 0.17 * (len(mechs) - 18)))
            loss_ax, acc_ax = fig.subplots(1, 2)
            for (mech, cs), style in zip(mechs.items(), series_styles(len(mechs)), strict=True):
                for ax, column in ((loss_ax, 1), (acc_ax, 2)):
                    steps, values = _mean_curve(cs, column)
                    if steps:  # a colour, a marker and a dash each: 18 series stay apart
                        ax.plot(steps, values, markersize=3, linewidth=1.2, label=mech,
                                **{**style, "marker": style["marker"] if len(steps) < 30 else None})
            loss_ax.set(xlabel="step", ylabel="training loss", title=f"{task}: training loss")
            acc_ax.set(xlabel="step", ylabel="evaluation accuracy", title=f"{task}: evaluation accuracy",
                       ylim=(-0.02, 1.02))
            for ax in (loss_ax, acc_ax):
                ax.grid(True, alpha=0.25)
            handles, labels = max((ax.get_legend_handles_labels() for ax in (loss_ax, acc_ax)), key=lambda h: len(h[1]))
            if labels:
                fig.legend(handles, labels, loc="outside right center", fontsize=8)
            written.append((task, _save(fig, rep.out / "img" / f"curves__{slug(task)}.png")))
        except Exception as err:  # a picture that cannot be drawn is noted, the report goes on
            notes.append(f"learning curves of {task}: {type(err).__name__}: {err}")
    return written, notes


def _tensor(value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().float().cpu()

    def clean(x):
        return [clean(v) for v in x] if isinstance(x, list) else (math.nan if x is None else x)
    return torch.tensor(clean(value), dtype=torch.float32)


def as_maps(example: dict) -> dict[str, torch.Tensor]:
    """An example's maps as float tensors (JSON nested lists, tensors, NaN written as null all accepted)."""
    return {str(name): _tensor(value) for name, value in (example.get("maps") or {}).items()}


def _tokens(tokens, name: str):
    return tokens.get(name) if isinstance(tokens, dict) else tokens


def _picture(example: dict, maps: dict[str, torch.Tensor], path: Path) -> Path:
    from ...viz import alignment, head_grid

    title = str(example.get("title", ""))
    if len(maps) == 1:
        name, w = next(iter(maps.items()))
        w2 = w[0] if w.dim() == 3 and w.shape[0] == 1 else w
        q, k = _tokens(example.get("q_tokens"), name), _tokens(example.get("k_tokens"), name)
        if w2.dim() == 2 and q is not None and k is not None and (len(q), len(k)) == tuple(w2.shape):
            return _save(alignment(w2, k, q, title=title), path)
    q_tokens, k_tokens = _fitting(example.get("q_tokens"), maps, -2), _fitting(example.get("k_tokens"), maps, -1)
    # the tour's maps are short (tens of positions): a linear scale shows where the weight goes
    return _save(head_grid(maps, title=title, max_heads=8, q_tokens=q_tokens, k_tokens=k_tokens, scale="linear"), path)


def _fitting(tokens, maps: dict[str, torch.Tensor], dim: int) -> dict[str, list]:
    """The example's tokens of each map whose length along ``dim`` they fit (the others are drawn with positions)."""
    out = {}
    for name, w in maps.items():
        labels = _tokens(tokens, name)
        if isinstance(labels, list) and len(labels) == w.shape[dim]:
            out[name] = labels
    return out


def _page(key: str, examples: list[dict], path: Path) -> Path:
    from ...viz import html_page

    maps, q_tok, k_tok = {}, {}, {}
    for i, ex in enumerate(examples):
        for name, w in as_maps(ex).items():
            label = f"{ex.get('title') or f'example {i}'}: {name}"
            maps[label] = w
            q_tok[label], k_tok[label] = _tokens(ex.get("q_tokens"), name), _tokens(ex.get("k_tokens"), name)
    return html_page(maps, q_tokens=q_tok, k_tokens=k_tok, title=f"attnkit tour: {key}", path=path, scale="linear")


def attention_maps(rep: Report) -> tuple[list[dict], list[str]]:
    """Per experiment (lowest successful seed): a PNG per example and one interactive page of all its maps."""
    first: dict[str, dict] = {}
    for rec in rep.records:
        if rec["status"] == "ok" and rec["result"].get("examples"):
            first.setdefault(rec["key"], rec)
    written, notes = [], []
    for key, rec in first.items():
        examples = [e for e in rec["result"]["examples"] if isinstance(e, dict)][:MAX_EXAMPLES]
        entry = {"key": key, "seed": rec["seed"], "images": [], "page": None}
        for i, ex in enumerate(examples):
            try:
                path = rep.out / "img" / f"maps__{slug(key)}__{i}.png"
                entry["images"].append((str(ex.get("title", "")), _picture(ex, as_maps(ex), path)))
            except Exception as err:  # noted in the report
                notes.append(f"attention map {i} of {key}: {type(err).__name__}: {err}")
        try:
            entry["page"] = _page(key, examples, rep.out / "maps" / f"{slug(key)}.html") if examples else None
        except Exception as err:  # noted in the report
            notes.append(f"interactive maps of {key}: {type(err).__name__}: {err}")
        written.append(entry)
    return written, notes


def cost_plot(rep: Report) -> tuple[Path | None, list[str]]:
    """Analytic matmul FLOPs against sequence length (other sizes as in the cost table), one line each."""
    from ....costing.analytic import cost
    from .scaling import length_sizes

    entries = [e for e in rep.costs if e["cost"] is not None]
    if not entries:
        return None, []
    notes = []
    try:
        from ...viz._style import series_styles

        fig = _figure(7.4, 4.8)
        ax = fig.add_subplot()
        for e, style in zip(entries, series_styles(len(entries)), strict=True):  # a colour, marker and dash each
            try:
                pts = [(n, cost(e["name"], **{**e["sizes"], **length_sizes(e["name"], n)}).flops)
                       for n in PLOT_LENGTHS]
            except (ValueError, TypeError) as err:
                notes.append(f"cost of {e['name']} against length: {err}")
                continue
            ax.plot(*zip(*pts, strict=True), markersize=4, linewidth=1.4, label=f"{e['mechanism']} ({e['name']})",
                    **style)
        ax.set_xscale("log", base=2)
        ax.set(yscale="log", xlabel="sequence length L", ylabel="matmul FLOPs (forward, analytic)",
               title="analytic cost against length L\n(forward; other sizes as in the cost table)")
        ax.set_xticks(PLOT_LENGTHS, [str(n) for n in PLOT_LENGTHS])
        ax.minorticks_off()
        ax.grid(True, which="major", alpha=0.25)
        if ax.lines:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        return _save(fig, rep.out / "img" / "cost.png"), notes
    except Exception as err:  # noted in the report
        return None, [*notes, f"cost plot: {type(err).__name__}: {err}"]


def scaling_picture(rep: Report) -> tuple[Path | None, list[str]]:
    """The measured scaling plot (time and peak memory against length), from the cached measurement."""
    series = (rep.scaling or {}).get("series") or {}
    if not series:
        return None, []
    try:
        from ...viz import scaling_plot
        from .scaling import REPEATS, SIZES

        points = {k: [(int(p[0]), p[1], p[2] if len(p) > 2 else None) for p in v] for k, v in series.items() if v}
        data = rep.scaling or {}
        sizes = ", ".join(f"{k}={v}" for k, v in (data.get("sizes") or SIZES).items())
        fig = scaling_plot(points, title=f"measured time (median of {data.get('repeats', REPEATS)}) and peak memory "
                                         f"against L: forward + backward, fresh process per point at "
                                         f"{data.get('threads', 1)} thread ({sizes}; dim: a module's width)")
        return _save(fig, rep.out / "img" / "scaling.png"), []
    except Exception as err:  # noted in the report
        return None, [f"scaling plot: {type(err).__name__}: {err}"]
