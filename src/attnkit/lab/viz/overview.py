"""All heads on one offline HTML page: every map's heads as small pictures, each a link to the one-head viewer.

The companion of :func:`attnkit.lab.viz.html_page`: that page shows one head large with its
tokens; this one shows them all at once (rows = maps, e.g. layers; columns = heads) so a
reader can spot the interesting heads, then click one to open it there. Self-contained
(inline script, style and data), no matplotlib.
"""

from __future__ import annotations

import html
from pathlib import Path

from ._overview_page import TEMPLATE
from ._scale import DEFAULT_SCALE
from ._style import check_path
from .html import MAX_WEIGHTS, page_data, write_page

__all__ = ["overview_page", "THUMBNAIL"]

THUMBNAIL = 96  # the longer side of a thumbnail in CSS pixels: longer maps are pooled to it
_SCALE_WORDS = {"linear": "0 to the row's largest weight", "log": "the row's largest weight down to 10^-3 of it, "
                "logarithmically", "row": "each query row over its largest weight"}


def overview_page(maps, *, viewer, path, title="attention heads", max_weights: int = MAX_WEIGHTS,
                  scale: str = DEFAULT_SCALE, max_size: int | None = None) -> Path:
    """Write one offline HTML page with every head of every map as a small picture linking to ``viewer``.

    Each row is one map and shares one colour scale (viridis, linear, log or per row, as
    :func:`attnkit.lab.viz.head_grid`), so the heads of a layer compare; the thumbnail of head
    ``h`` of the ``i``-th map links to ``viewer#layer=i&head=h``. Maps longer than a thumbnail
    (:data:`THUMBNAIL` pixels) are pooled to its size, rows keeping their sums, so 12 layers x
    12 heads of 512 tokens make a page of 1.3M weights, not 38M. Write the viewer from the
    same maps (:func:`attnkit.lab.viz.html_page`, ``overview=`` links back).

    Args:
        maps: what :func:`attnkit.lab.viz.html_page` takes (a mapping, a recording, a
            transformers model's ``outputs.attentions``); ``(B, H, Lq, Lk)`` shows sample 0.
        viewer: the address of the one-head viewer page, relative to this page (``"maps.html"``).
        path: the ``.html`` file to write.
        title: page title (escaped).
        max_weights: the most weights the page may hold, after pooling (as :func:`attnkit.lab.viz.html_page`).
        scale: ``"log"`` (default), ``"linear"`` or ``"row"``.
        max_size: pool the thumbnails further, to at most this many cells per axis (below :data:`THUMBNAIL`).

    Returns:
        The Path written.

    Example:
        >>> import tempfile, pathlib, torch
        >>> from attnkit.lab.viz import overview_page
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> out = overview_page({"layer 0": torch.rand(2, 3, 4)}, viewer="maps.html", path=folder / "heads.html")
        >>> 'href="maps.html"' in out.read_text()
        True
    """
    path = check_path(path, (".html", ".htm"))
    data, _ = page_data(maps, q_tokens=None, k_tokens=None, max_weights=max_weights, who="overview_page",
                        scale=scale, max_size=min(max_size or THUMBNAIL, THUMBNAIL))
    values = {"TITLE": html.escape(str(title)), "DATA": data, "VIEWER": html.escape(str(viewer), quote=True),
              "SCALE": _SCALE_WORDS[scale]}
    return write_page(TEMPLATE, values, path)
