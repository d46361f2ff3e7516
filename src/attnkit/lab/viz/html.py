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

from ...errors import ArgumentError, ShapeError, check_int
from ..analysis.model_maps import maps_and_tokens
from ._page import TEMPLATE
from ._pool import fit_size, pool, pooled_labels
from ._scale import DEFAULT_SCALE, check_scale
from ._style import check_path, checked, labels_or_recorded

__all__ = ["html_page", "viewer_html", "page_data", "fit_maps", "render", "write_page"]

MAX_WEIGHTS = 4_000_000  # about 40 MB of page; more loads slowly or not at all in a browser
FIT = "fit"  # html_page's max_size: pool only as much as max_weights asks


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


def _map_json(name: str, heads: torch.Tensor, batch: int, q_tokens, k_tokens, max_size: int | None) -> str:
    _, lq, lk = heads.shape
    q, k = _tokens(q_tokens, name, lq, "q_tokens"), _tokens(k_tokens, name, lk, "k_tokens")
    pooled, q_edges, k_edges = pool(heads.detach().to("cpu", torch.float64), max_size)
    meta = {"name": name, "batch": batch, "lq": pooled.shape[1], "lk": pooled.shape[2], "n": [lq, lk],
            "q": pooled_labels(q, q_edges), "k": pooled_labels(k, k_edges)}
    return json.dumps(meta)[:-1] + ',"w":[' + ",".join(_numbers(h) for h in pooled) + "]}"


def page_data(maps, *, q_tokens, k_tokens, max_weights: int, who: str, scale: str = DEFAULT_SCALE,
              max_size: int | None = None) -> tuple[str, list[tuple[str, int]]]:
    """The escaped JSON a page embeds, and ``[(name, heads), ...]``; ArgumentError past ``max_weights`` (counted
    after pooling to ``max_size`` per axis) before any copy. ``maps`` as :func:`html_page` takes them."""
    check_int(who, "max_weights", max_weights, 1)
    check_scale(who, scale)
    if max_size is not None:
        check_int(who, "max_size", max_size, 1)
    maps, found = maps_and_tokens(maps, who)
    q_tokens, k_tokens = labels_or_recorded(q_tokens, found, 0), labels_or_recorded(k_tokens, found, 1)
    views = {str(name): _heads(str(name), value) for name, value in maps.items()}
    size = max_size or max((max(h.shape[1:]) for h, _ in views.values()), default=1)
    total = sum(h.shape[0] * min(h.shape[1], size) * min(h.shape[2], size) for h, _ in views.values())
    if total > max_weights:
        sizes = ", ".join(f"{name}: {tuple(heads.shape)}" for name, (heads, _) in list(views.items())[:4])
        pooled = "" if max_size is None else f" pooled to at most {max_size} per axis"
        raise ArgumentError(f"{who}: the maps hold {total:,} weights{pooled} (H, Lq, Lk per map: {sizes}"
                            f"{', ...' if len(views) > 4 else ''}), a page of about {total * 10 / 2**20:,.0f} MiB; "
                            f"the limit is max_weights={max_weights:,}. Pass fewer layers or heads, pool the maps "
                            f"(max_size; fit_maps finds the largest that fits) or raise max_weights")
    parts = [_map_json(name, heads, batch, q_tokens, k_tokens, max_size) for name, (heads, batch) in views.items()]
    data = '{"scale":' + json.dumps(scale) + ',"maps":[' + ",".join(parts) + "]}"
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return data, [(name, heads.shape[0]) for name, (heads, _) in views.items()]


def fit_maps(maps, max_weights: int, who: str) -> int | None:
    """The largest ``max_size`` with which ``maps`` (what :func:`html_page` takes) fit in ``max_weights``
    weights; None when they fit as they are."""
    found, _ = maps_and_tokens(maps, who)
    shapes = [(h.shape[0], h.shape[1], h.shape[2]) for h in (_heads(str(n), v)[0] for n, v in found.items())]
    return fit_size(shapes, max_weights, who)


def render(template: str, values: dict[str, str]) -> str:
    """``template`` with its ``__NAME__`` placeholders filled (values already escaped)."""
    return re.sub(r"__([A-Z]+)__", lambda m: values.get(m.group(1), m.group(0)), template)


def write_page(template: str, values: dict[str, str], path: Path) -> Path:
    """Fill the ``__NAME__`` placeholders of ``template`` (values already escaped) and write it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(template, values), encoding="utf-8")
    return path


def viewer_html(maps, *, q_tokens=None, k_tokens=None, title="attention maps", max_weights: int = MAX_WEIGHTS,
                overview=None, scale: str = DEFAULT_SCALE, max_size: int | str | None = FIT) -> str:
    """The text of the page :func:`html_page` writes (arguments as there)."""
    # pooled only past max_weights, as attnkit record does (one rule: fit_maps)
    size = fit_maps(maps, max_weights, "html_page") if max_size == FIT else max_size
    if isinstance(size, str):
        raise ArgumentError(f"html_page: max_size must be 'fit', a positive int or None; got {size!r}")
    data, _ = page_data(maps, q_tokens=q_tokens, k_tokens=k_tokens, max_weights=max_weights, who="html_page",
                        scale=scale, max_size=size)
    nav = "" if overview is None else f'<a id="overview" href="{html.escape(str(overview), quote=True)}">all heads</a>'
    return render(TEMPLATE, {"TITLE": html.escape(str(title)), "DATA": data, "NAV": nav})


def html_page(maps, *, q_tokens=None, k_tokens=None, title="attention maps", path, max_weights: int = MAX_WEIGHTS,
              overview=None, scale: str = DEFAULT_SCALE, max_size: int | str | None = FIT) -> Path:
    """Write one offline HTML page showing attention maps, with layer/head pickers and hover details.

    The page draws the chosen map on a canvas (viridis on a linear, log or per-row scale, as
    :func:`attnkit.lab.viz.head_grid`; grey for NaN/inf) with token labels; hovering a cell shows its
    query, key and weight, and the entropy (nats) of that query row normalised to sum 1. The URL
    hash selects what is shown, so views can be linked: ``page.html#layer=1&head=2`` (``layer`` is
    an index or a map name) and ``&q=3&k=4`` also shows the details of that cell.
    :func:`attnkit.lab.viz.overview_page` draws every head of every map on one page, each
    linking here. Long maps over many layers and heads outgrow a page (a 512-token map of 12
    layers x 12 heads holds 38M weights): by default the page pools them to what ``max_weights``
    allows (groups of consecutive positions, each row keeping its sum; the cells are then labelled
    ``first…last``), as ``attnkit record`` does; pick the maps and heads
    (:meth:`~attnkit.lab.analysis.AttentionRecorder.select`) to see every position.

    Args:
        maps: ``Mapping[str, tensor]``, each ``(H, Lq, Lk)``, ``(B, H, Lq, Lk)`` (sample 0
            is shown) or ``(Lq, Lk)`` (one head); an :class:`~attnkit.lab.analysis.AttentionRecorder`
            (its tokens label the maps); or a transformers model's ``outputs.attentions``
            (a tuple of ``(B, H, Lq, Lk)``, one per layer) or whole output.
        q_tokens, k_tokens: query / key token labels, one sequence for every map, or a
            mapping map name -> tokens; a recording's own tokens, else positions, where none are given.
        title: page title (escaped).
        path: the ``.html`` file to write.
        max_weights: the most weights the page may hold (about 10 bytes each), counted after
            pooling. With ``max_size=None`` or a size, more raises before anything is converted or
            written: pick layers/heads, pool the maps, or raise it knowingly.
        overview: the address of an overview page (relative to this one) to link to, or None.
        scale: ``"log"`` (default, as the command line: the largest weight down to 10^-3 of it),
            ``"linear"`` (0 to the map's largest weight) or ``"row"``.
        max_size: ``"fit"`` (default): every position when the maps fit ``max_weights``, else pooled
            to the largest size that fits (:func:`fit_maps`); a number: pool every map to at most
            this many cells per axis; None: every position, whatever the size.

    Returns:
        The Path written.

    Example:
        >>> import tempfile, pathlib, torch
        >>> from attnkit.lab.viz import html_page
        >>> out = html_page({"layer 0": torch.rand(2, 3, 4)}, path=pathlib.Path(tempfile.mkdtemp()) / "maps.html")
        >>> "<canvas" in out.read_text() and "http" not in out.read_text()
        True
    """
    path = check_path(path, (".html", ".htm"))
    page = viewer_html(maps, q_tokens=q_tokens, k_tokens=k_tokens, title=title, max_weights=max_weights,
                       overview=overview, scale=scale, max_size=max_size)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
    return path
