"""One self-contained HTML page to browse attention maps offline: pick a layer and a head, hover a cell.

The page needs no network: its script, style and data are inline (the weights as
JSON, 4 significant digits). Labels and the title are escaped; no matplotlib needed.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Mapping
from pathlib import Path

import torch

from ..analysis.model_maps import maps_and_tokens
from ..errors import ArgumentError, ShapeError, check_int
from ._page import TEMPLATE
from ._style import check_path, checked, labels_or_recorded

__all__ = ["html_page", "page_data", "write_page"]

MAX_WEIGHTS = 4_000_000  # about 40 MB of page; more loads slowly or not at all in a browser


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


def _heads(name: str, value) -> tuple[torch.Tensor, int]:
    """``(H, Lq, Lk)`` view of a map (sample 0 of a batch), not yet copied, and its batch size."""
    w = checked(value, f"html_page: maps[{name!r}]", (2, 3, 4), "(Lq, Lk), (H, Lq, Lk) or (B, H, Lq, Lk)")
    return (w[None] if w.dim() == 2 else w[0] if w.dim() == 4 else w), (w.shape[0] if w.dim() == 4 else 1)


def _map_json(name: str, heads: torch.Tensor, batch: int, q_tokens, k_tokens) -> str:
    _, lq, lk = heads.shape
    meta = {"name": name, "batch": batch, "lq": lq, "lk": lk,
            "q": _tokens(q_tokens, name, lq, "q_tokens"), "k": _tokens(k_tokens, name, lk, "k_tokens")}
    weights = ",".join(_numbers(h) for h in heads.detach().to("cpu", torch.float64))
    return json.dumps(meta)[:-1] + ',"w":[' + weights + "]}"


def page_data(maps, *, q_tokens, k_tokens, max_weights: int, who: str) -> tuple[str, list[tuple[str, int]]]:
    """The escaped JSON a page embeds, and ``[(name, heads), ...]``; ArgumentError past ``max_weights`` before any
    copy. ``maps`` as :func:`html_page` takes them."""
    check_int(who, "max_weights", max_weights, 1)
    maps, found = maps_and_tokens(maps, who)
    q_tokens, k_tokens = labels_or_recorded(q_tokens, found, 0), labels_or_recorded(k_tokens, found, 1)
    views = {str(name): _heads(str(name), value) for name, value in maps.items()}
    total = sum(heads.numel() for heads, _ in views.values())
    if total > max_weights:
        sizes = ", ".join(f"{name}: {tuple(heads.shape)}" for name, (heads, _) in list(views.items())[:4])
        raise ArgumentError(f"{who}: the maps hold {total:,} weights (H, Lq, Lk per map: {sizes}"
                            f"{', ...' if len(views) > 4 else ''}), a page of about {total * 10 / 2**20:,.0f} MiB; "
                            f"the limit is max_weights={max_weights:,}. Pass fewer layers or heads, crop the "
                            f"sequences, or raise max_weights")
    parts = [_map_json(name, heads, batch, q_tokens, k_tokens) for name, (heads, batch) in views.items()]
    data = '{"maps":[' + ",".join(parts) + "]}"
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return data, [(name, heads.shape[0]) for name, (heads, _) in views.items()]


def write_page(template: str, values: dict[str, str], path: Path) -> Path:
    """Fill the ``__NAME__`` placeholders of ``template`` (values already escaped) and write it."""
    page = re.sub(r"__([A-Z]+)__", lambda m: values.get(m.group(1), m.group(0)), template)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path


def html_page(maps, *, q_tokens=None, k_tokens=None, title="attention maps", path,
              max_weights: int = MAX_WEIGHTS, overview=None) -> Path:
    """Write one offline HTML page showing attention maps, with layer/head pickers and hover details.

    The page draws the chosen map on a canvas (viridis, 0 to the map's maximum; grey for
    NaN/inf) with token labels; hovering a cell shows its query, key and weight, and
    the entropy (nats) of that query row normalised to sum 1. The URL hash selects
    what is shown, so views can be linked: ``page.html#layer=1&head=2`` (``layer`` is
    an index or a map name) and ``&q=3&k=4`` also shows the details of that cell.
    :func:`attnkit.viz.overview_page` draws every head of every map on one page, each
    linking here.

    Args:
        maps: ``Mapping[str, tensor]``, each ``(H, Lq, Lk)``, ``(B, H, Lq, Lk)`` (sample 0
            is shown) or ``(Lq, Lk)`` (one head); an :class:`~attnkit.analysis.AttentionRecorder`
            (its tokens label the maps); or a transformers model's ``outputs.attentions``
            (a tuple of ``(B, H, Lq, Lk)``, one per layer) or whole output.
        q_tokens, k_tokens: query / key token labels, one sequence for every map, or a
            mapping map name -> tokens; a recording's own tokens, else positions, where none are given.
        title: page title (escaped).
        path: the ``.html`` file to write.
        max_weights: the most weights the page may hold (about 10 bytes each); more raises
            before anything is converted or written. Pick layers/heads or crop the maps, or
            raise it knowingly.
        overview: the address of an overview page (relative to this one) to link to, or None.

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
    data, _ = page_data(maps, q_tokens=q_tokens, k_tokens=k_tokens, max_weights=max_weights, who="html_page")
    nav = "" if overview is None else f'<a id="overview" href="{html.escape(str(overview), quote=True)}">all heads</a>'
    return write_page(TEMPLATE, {"TITLE": html.escape(str(title)), "DATA": data, "NAV": nav}, path)
