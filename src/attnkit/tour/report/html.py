"""The HTML half of the tour report: ``out/index.html``, one offline page with every picture embedded.

Pictures are PNG files under ``out/img/`` and are also embedded as base64 ``data:``
URIs, so the page alone is complete; the interactive attention-map pages
(``out/maps/<key>.html``, :func:`attnkit.viz.html_page`) are linked relatively. The
page loads nothing from the network.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from . import Report, table_rows
from .markdown import descriptions, extra_rows, run_info, task_lines
from .plots import attention_maps, cost_plot, curves, scaling_picture
from .recall import recall_html
from .scaling import cost_table, scaling_markdown

__all__ = ["write_html"]

STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; max-width: 1100px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 14px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
td.failed { color: #a00; font-weight: 600; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5em 0; }
pre { background: #f7f7f7; padding: 0.6em; overflow-x: auto; font-size: 13px; }
.note { color: #777; }
"""


def _e(text) -> str:
    return html.escape(str(text))


def _table(rows: list[list[str]], failed_column: int | None = None) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in rows[0])
    body = []
    for row in rows[1:]:
        cells = []
        for i, c in enumerate(row):
            bad = i == failed_column and ("failed" in str(c) or str(c) == "n/a")
            cells.append(('<td class="failed">' if bad else "<td>") + f"{_e(c)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _img(path: Path | None, alt: str) -> str:
    if path is None:
        return ""
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{data}">'


def _maps_section(rep: Report, notes: list[str]) -> list[str]:
    entries, more = attention_maps(rep)
    notes += more
    parts = ["<h2>Attention maps of the trained models</h2>"]
    if not entries:
        parts.append('<p class="note">No attention maps were recorded.</p>')
    for entry in entries:
        parts.append(f"<h3>{_e(entry['key'])} <span class=\"note\">(seed {entry['seed']})</span></h3>")
        for title, path in entry["images"]:
            parts.append(_img(path, f"{entry['key']}: {title}"))
        if entry["page"] is not None:
            href = Path(entry["page"]).relative_to(rep.out).as_posix()
            parts.append(f'<p><a href="{_e(href)}">interactive maps (pick layer and head)</a></p>')
    return parts


def _cost_section(rep: Report, notes: list[str]) -> list[str]:
    parts = ["<h2>Cost and scaling</h2>"]
    if rep.costs:
        parts += ["<h3>Analytic cost at the tour's sizes (forward pass)</h3>", _table(cost_table(rep.costs))]
        path, more = cost_plot(rep)
        notes += more
        parts.append(_img(path, "analytic cost against length"))
    else:
        parts.append('<p class="note">No tour mechanism has a cost formula.</p>')
    scaling = rep.scaling
    if scaling and scaling.get("series"):
        path, more = scaling_picture(rep)
        notes += more
        parts += ["<h3>Measured scaling</h3>", _img(path, "measured scaling"),
                  f"<pre>{_e(scaling_markdown(scaling))}</pre>"]
    elif scaling and scaling.get("error"):
        parts.append(f'<p class="note">The scaling measurement failed: {_e(scaling["error"])}</p>')
    else:
        parts.append('<p class="note">Scaling not measured (it runs in the default mode only).</p>')
    return parts


def _body(rep: Report) -> list[str]:
    notes: list[str] = []
    mode = (rep.manifest or {}).get("mode", "")
    parts = [f"<h1>attnkit tour{f' ({_e(mode)})' if mode else ''}</h1>",
             "<p>Accuracy is each task's test metric in percent, mean ± sample standard deviation over seeds; "
             "time and memory are means over seeds.</p>", _table(table_rows(rep.rows), failed_column=2),
             "<h2>What each task tests</h2><ul>"]
    parts += [f"<li><b>{_e(t)}</b>: {_e(line)}</li>" for t, line in task_lines(rep.rows)] + ["</ul>"]
    desc = descriptions()
    if any(desc.get(r.key) for r in rep.rows):
        parts += ["<h2>Experiments</h2><ul>"]
        parts += [f"<li><code>{_e(r.key)}</code>: {_e(desc.get(r.key, ''))}</li>" for r in rep.rows] + ["</ul>"]
    extras = extra_rows(rep.rows)
    if len(extras) > 1:
        parts += ["<h2>Extra metrics</h2>", _table(extras)]
    failed = [(r.key, s, e) for r in rep.rows for s, e in r.failed.items()]
    if failed:
        parts += ["<h2>Failed runs</h2><ul>"]
        parts += [f"<li><code>{_e(k)}</code> seed {s}: <code>{_e(e)}</code></li>" for k, s, e in failed] + ["</ul>"]
    written, more = curves(rep)
    notes += more
    parts.append("<h2>Learning curves</h2>")
    parts += [_img(path, f"learning curves: {task}") for task, path in written]
    parts += _maps_section(rep, notes) + _cost_section(rep, notes) + recall_html(rep, notes, _table, _img)
    parts += ["<h2>How it was run</h2><table>"]
    parts += [f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in run_info(rep)] + ["</table>"]
    if notes:
        parts += ["<h2>Pictures not drawn</h2><ul>"] + [f"<li>{_e(n)}</li>" for n in notes] + ["</ul>"]
    return parts


def write_html(rep: Report) -> Path:
    """Write ``out/index.html`` (and its pictures under ``out/img/``, map pages under ``out/maps/``)."""
    page = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            "<title>attnkit tour</title>", f"<style>{STYLE}</style></head><body>", *_body(rep), "</body></html>"]
    path = rep.out / "index.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(page) + "\n", encoding="utf-8")
    return path
