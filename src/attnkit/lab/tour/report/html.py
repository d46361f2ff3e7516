"""The HTML half of the tour report: ``out/index.html``, one offline page with every picture embedded.

Pictures are PNG files under ``out/img/`` and are also embedded as base64 ``data:``
URIs, so the page alone is complete; the interactive attention-map pages
(``out/maps/<key>.html``, :func:`attnkit.lab.viz.html_page`) are linked relatively. The
page loads nothing from the network.
"""

from __future__ import annotations

import html
from pathlib import Path

from ..catalogue import LEFT_OUT
from . import Report, table_rows
from .claims import claims_html
from .mad import mad_html
from .markdown import descriptions, extra_rows, run_info, task_lines
from .pieces import html_image, html_table, write_page
from .plots import attention_maps, cost_plot, curves, scaling_picture
from .recall import recall_html
from .scaling import cost_table, scaling_markdown
from .state import state_html

__all__ = ["write_html"]

def _e(text) -> str:
    return html.escape(str(text))


def _maps_section(rep: Report, notes: list[str]) -> list[str]:
    entries, more = attention_maps(rep)
    notes += more
    parts = ["<h2>Attention maps of the trained models</h2>"]
    if not entries:
        parts.append('<p class="note">No attention maps were recorded.</p>')
    for entry in entries:
        parts.append(f"<h3>{_e(entry['key'])} <span class=\"note\">(seed {entry['seed']})</span></h3>")
        for title, path in entry["images"]:
            parts.append(html_image(path, f"{entry['key']}: {title}"))
        if entry["page"] is not None:
            href = Path(entry["page"]).relative_to(rep.out).as_posix()
            parts.append(f'<p><a href="{_e(href)}">interactive maps (pick layer and head)</a></p>')
    return parts


def _cost_section(rep: Report, notes: list[str]) -> list[str]:
    parts = ["<h2>Cost and scaling</h2>"]
    if rep.costs:
        parts += ["<h3>Analytic cost at the tour's sizes (forward pass)</h3>", html_table(cost_table(rep.costs))]
        path, more = cost_plot(rep)
        notes += more
        parts.append(html_image(path, "analytic cost against length"))
    else:
        parts.append('<p class="note">No tour mechanism has a cost formula.</p>')
    scaling = rep.scaling
    if scaling and scaling.get("series"):
        path, more = scaling_picture(rep)
        notes += more
        parts += ["<h3>Measured scaling</h3>", html_image(path, "measured scaling"),
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
             "time and memory are means over seeds.</p>", html_table(table_rows(rep.rows), failed_column=2),
             "<h2>What each task tests</h2><ul>"]
    parts += [f"<li><b>{_e(t)}</b>: {_e(line)}</li>" for t, line in task_lines(rep.rows)] + ["</ul>"]
    desc = descriptions()
    if any(desc.get(r.key) for r in rep.rows):
        parts += ["<h2>Experiments</h2><ul>"]
        parts += [f"<li><code>{_e(r.key)}</code>: {_e(desc.get(r.key, ''))}</li>" for r in rep.rows] + ["</ul>"]
    extras = extra_rows(rep.rows)
    if len(extras) > 1:
        parts += ["<h2>Extra metrics</h2>", html_table(extras)]
    failed = [(r.key, s, e) for r in rep.rows for s, e in r.failed.items()]
    if failed:
        parts += ["<h2>Failed runs</h2><ul>"]
        parts += [f"<li><code>{_e(k)}</code> seed {s}: <code>{_e(e)}</code></li>" for k, s, e in failed] + ["</ul>"]
    written, more = curves(rep)
    notes += more
    parts.append("<h2>Learning curves</h2>")
    parts += [html_image(path, f"learning curves: {task}") for task, path in written]
    parts += _maps_section(rep, notes) + _cost_section(rep, notes) + recall_html(rep, notes, html_table, html_image)
    parts += state_html(rep, notes, html_table, html_image) + mad_html(rep, notes, html_table, html_image)
    parts += claims_html(rep)
    parts += ["<h2>Registry entries the tour leaves out</h2><ul>"]
    parts += [f"<li><b>{_e(k)}</b>: {_e(v)}</li>" for k, v in LEFT_OUT.items()] + ["</ul>"]
    parts += ["<h2>How it was run</h2><table>"]
    parts += [f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in run_info(rep)] + ["</table>"]
    if notes:
        parts += ["<h2>Pictures not drawn</h2><ul>"] + [f"<li>{_e(n)}</li>" for n in notes] + ["</ul>"]
    return parts


def write_html(rep: Report) -> Path:
    """Write ``out/index.html`` (and its pictures under ``out/img/``, map pages under ``out/maps/``)."""
    return write_page(rep.out / "index.html", "attnkit tour", _body(rep))
