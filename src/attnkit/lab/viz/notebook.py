"""Attention maps in a notebook: ``attnkit.lab.viz.show(recorder)`` displays a recording.

Jupyter shows an object through its ``_repr_html_`` / ``_repr_png_``. The recorder
(:class:`attnkit.lab.analysis.AttentionRecorder`) sits below the pictures in the package,
so the views are here, on a small object that holds the recording: the one-head viewer
(:func:`attnkit.lab.viz.html_page`'s page, log scale) in a frame, pooled to fit
:data:`NOTEBOOK_WEIGHTS`, and every head of every map as a PNG when matplotlib is installed.
"""

from __future__ import annotations

import html
import io

from .html import fit_maps, viewer_html
from .maps import head_grid

__all__ = ["MapsView", "show", "NOTEBOOK_WEIGHTS"]

NOTEBOOK_WEIGHTS = 1_000_000  # a recording shown in a notebook is pooled to at most this many weights (about 10 MB)


class MapsView:
    """A recording as a notebook displays it (``show(recorder)`` makes one)."""

    def __init__(self, recorder):
        self.recorder = recorder

    def __repr__(self) -> str:
        return f"MapsView({len(self.recorder.maps)} attention maps)"

    def _repr_html_(self) -> str:
        rec = self.recorder
        if not rec.maps:
            return "<p>AttentionRecorder: no attention map recorded</p>"
        maps = rec.picture_maps()
        page = viewer_html(maps, title=f"{len(maps)} attention maps", scale="log",
                           max_size=fit_maps(maps, NOTEBOOK_WEIGHTS, "AttentionRecorder"),
                           max_weights=NOTEBOOK_WEIGHTS, **rec.labels())
        return (f'<iframe srcdoc="{html.escape(page, quote=True)}" style="width: 100%; height: 720px; border: 0" '
                f'title="attention maps"></iframe>')

    def _repr_png_(self) -> bytes | None:
        """Every head of every map, log scale; None without matplotlib (the notebook then shows the HTML view)."""
        rec = self.recorder
        try:
            fig = head_grid(rec.picture_maps(), scale="log", **rec.labels()) if rec.maps else None
        except ImportError:
            return None
        if fig is None:
            return None
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=100)
        return buffer.getvalue()


def show(recorder) -> MapsView:
    """The recording's notebook view: end a cell with ``attnkit.lab.viz.show(recorder)``."""
    return MapsView(recorder)
