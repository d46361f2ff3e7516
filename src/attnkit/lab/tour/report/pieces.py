"""The page pieces both tours' reports are made of: tables in Markdown and HTML, embedded pictures, the page.

Every page is one offline HTML file: pictures are embedded as base64 ``data:`` URIs and the page
loads nothing from the network. Tables are lists of rows of strings, header first.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

__all__ = ["STYLE", "cell", "md_table", "html_table", "html_image", "write_page"]

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


def cell(text) -> str:
    """``text`` as one Markdown table cell: pipes escaped, newlines folded."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def md_table(rows: list[list[str]]) -> list[str]:
    """The lines of a Markdown table (header, rule, rows)."""
    lines = ["| " + " | ".join(cell(c) for c in rows[0]) + " |", "|" + "---|" * len(rows[0])]
    return lines + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows[1:]]


def html_table(rows: list[list[str]], failed_column: int | None = None) -> str:
    """An HTML table; cells of ``failed_column`` that say "failed" or "n/a" are marked as failures."""
    e = html.escape
    head = "".join(f"<th>{e(str(c))}</th>" for c in rows[0])
    body = []
    for row in rows[1:]:
        cells = []
        for i, c in enumerate(row):
            bad = i == failed_column and ("failed" in str(c) or str(c) == "n/a")
            cells.append(('<td class="failed">' if bad else "<td>") + f"{e(str(c))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def html_image(path: Path | None, alt: str) -> str:
    """The PNG at ``path`` as an ``<img>`` with a ``data:`` URI ("" for None)."""
    if path is None:
        return ""
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def write_page(path: Path, title: str, body: list[str]) -> Path:
    """Write one offline HTML page with ``body`` (HTML fragments) under ``title``; returns ``path``."""
    page = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{html.escape(title)}</title>", f"<style>{STYLE}</style></head><body>", *body, "</body></html>"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(page) + "\n", encoding="utf-8")
    return path
