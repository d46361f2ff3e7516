"""All heads on one offline HTML page: every map's heads as small pictures, each a link to the one-head viewer.

The companion of :func:`attnkit.viz.html_page`: that page shows one head large with its
tokens; this one shows them all at once (rows = maps, e.g. layers; columns = heads) so a
reader can spot the interesting heads, then click one to open it there. Self-contained
(inline script, style and data), no matplotlib.
"""

from __future__ import annotations

import html
from pathlib import Path

from ._overview_page import TEMPLATE
from ._style import check_path
from .html import MAX_WEIGHTS, page_data, write_page

__all__ = ["overview_page"]


def overview_page(maps, *, viewer, path, title="attention heads", max_weights: int = MAX_WEIGHTS) -> Path:
    """Write one offline HTML page with every head of every map as a small picture linking to ``viewer``.

    Each row is one map and shares one colour scale (viridis, 0 to the row's largest
    weight, as :func:`attnkit.viz.head_grid`), so the heads of a layer compare; the
    thumbnail of head ``h`` of the ``i``-th map links to ``viewer#layer=i&head=h``.
    Write the viewer from the same maps (:func:`attnkit.viz.html_page`, ``overview=``
    links back).

    Args:
        maps: what :func:`attnkit.viz.html_page` takes (a mapping, a recording, a
            transformers model's ``outputs.attentions``); ``(B, H, Lq, Lk)`` shows sample 0.
        viewer: the address of the one-head viewer page, relative to this page (``"maps.html"``).
        path: the ``.html`` file to write.
        title: page title (escaped).
        max_weights: the most weights the page may hold (as :func:`attnkit.viz.html_page`).

    Returns:
        The Path written.

    Example:
        >>> import tempfile, pathlib, torch
        >>> from attnkit.viz import overview_page
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> out = overview_page({"layer 0": torch.rand(2, 3, 4)}, viewer="maps.html", path=folder / "heads.html")
        >>> 'href="maps.html"' in out.read_text()
        True
    """
    path = check_path(path, (".html", ".htm"))
    data, _ = page_data(maps, q_tokens=None, k_tokens=None, max_weights=max_weights, who="overview_page")
    values = {"TITLE": html.escape(str(title)), "DATA": data, "VIEWER": html.escape(str(viewer), quote=True)}
    return write_page(TEMPLATE, values, path)
