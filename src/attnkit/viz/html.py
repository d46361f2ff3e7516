"""One self-contained HTML page to browse attention maps offline: pick a layer and a head, hover a cell.

The page needs no network: its script, style and data are inline (the weights as
JSON, 4 significant digits). Labels and the title are escaped; no matplotlib needed.
"""

from __future__ import annotations

import html
import json
import math
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch

from ..errors import ArgumentError, ShapeError
from ._page import TEMPLATE
from ._style import as_weights, check_path

__all__ = ["html_page"]

_LARGE = 4_000_000  # weights above which the page gets slow to load; warn


def _tokens(tokens, name: str, n: int, arg: str) -> list[str]:
    """Labels for one map: given tokens (shared, or per map name), else positions."""
    if isinstance(tokens, Mapping):
        tokens = tokens.get(name)
    if tokens is None:
        return [str(i) for i in range(n)]
    labels = [str(t) for t in tokens]
    if len(labels) != n:
        raise ShapeError(f"html_page: {arg} has {len(labels)} tokens but maps[{name!r}] has {n} positions")
    return labels


def _numbers(w: torch.Tensor) -> str:
    """A JSON array of the weights, 4 significant digits, NaN/inf as null."""
    return "[" + ",".join(f"{x:.4g}" if math.isfinite(x) else "null" for x in w.flatten().tolist()) + "]"


def _map_json(name: str, value, q_tokens, k_tokens) -> tuple[str, int]:
    w = as_weights(value, f"html_page: maps[{name!r}]", (2, 3, 4), "(Lq, Lk), (H, Lq, Lk) or (B, H, Lq, Lk)")
    batch = w.shape[0] if w.dim() == 4 else 1
    heads = w[None] if w.dim() == 2 else w[0] if w.dim() == 4 else w  # (H, Lq, Lk); sample 0 of a batch
    _, lq, lk = heads.shape
    meta = {"name": name, "batch": batch, "lq": lq, "lk": lk,
            "q": _tokens(q_tokens, name, lq, "q_tokens"), "k": _tokens(k_tokens, name, lk, "k_tokens")}
    weights = ",".join(_numbers(h) for h in heads)
    return json.dumps(meta)[:-1] + ',"w":[' + weights + "]}", heads.numel()


def html_page(maps, *, q_tokens=None, k_tokens=None, title="attention maps", path) -> Path:
    """Write one offline HTML page showing attention maps, with layer/head pickers and hover details.

    The page draws the chosen map on a canvas (viridis, 0 to the map's maximum; grey for
    NaN/inf) with token labels; hovering a cell shows its query, key and weight, and
    the entropy (nats) of that query row normalised to sum 1. The URL hash selects
    what is shown, so views can be linked: ``page.html#layer=1&head=2`` (``layer`` is
    an index or a map name) and ``&q=3&k=4`` also shows the details of that cell.

    Args:
        maps: ``Mapping[str, tensor]``, each ``(H, Lq, Lk)``, ``(B, H, Lq, Lk)`` (sample 0
            is shown) or ``(Lq, Lk)`` (one head).
        q_tokens, k_tokens: query / key token labels, one sequence for every map, or a
            mapping map name -> tokens; positions are used where none are given.
        title: page title (escaped).
        path: the ``.html`` file to write.

    Returns:
        The Path written.

    Example:
        >>> import tempfile, pathlib, torch
        >>> from attnkit.viz import html_page
        >>> out = html_page({"layer 0": torch.rand(2, 3, 4)}, path=pathlib.Path(tempfile.mkdtemp()) / "maps.html")
        >>> "<canvas" in out.read_text() and "http" not in out.read_text()
        True
    """
    path = check_path(path, (".html", ".htm"))
    if not isinstance(maps, Mapping) or not maps:
        raise ArgumentError(f"html_page: maps must be a non-empty mapping name -> tensor; got {type(maps).__name__}")
    parts, total = [], 0
    for name, value in maps.items():
        text, count = _map_json(str(name), value, q_tokens, k_tokens)
        parts.append(text)
        total += count
    if total > _LARGE:
        warnings.warn(f"html_page: {total} weights make a large page that loads slowly; "
                      "pass fewer layers or shorter sequences", stacklevel=2)
    data = '{"maps":[' + ",".join(parts) + "]}"
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    values = {"TITLE": html.escape(str(title)), "DATA": data}
    page = re.sub(r"__(TITLE|DATA)__", lambda m: values[m.group(1)], TEMPLATE)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
