"""Pictures of attention: maps, head grids, alignments, mask patterns, scaling plots, an offline HTML page.

matplotlib is an optional extra (``pip install "attnkit[plot]"``), imported only
when a picture is drawn; figures are drawn on an Agg canvas outside pyplot, so
they work headless and never leak. :func:`html_page` (one head, large, with its tokens) and
:func:`overview_page` (every head, small, each linking to the first) need no matplotlib at all.
Maps are mappings name -> tensor, recordings (:class:`attnkit.lab.analysis.AttentionRecorder`), or a
transformers model's ``outputs.attentions``; :func:`to_bertviz` exports them for bertviz's views;
:func:`show` displays a recording in a notebook.
"""

from ._style import save
from .bertviz import to_bertviz
from .html import MAX_WEIGHTS, fit_maps, html_page
from .maps import alignment, head_grid, heatmap
from .notebook import MapsView, show
from .overview import overview_page
from .patterns import mask_density, mask_picture
from .scaling_plot import scaling_plot

__all__ = ["heatmap", "head_grid", "alignment", "mask_picture", "mask_density", "scaling_plot", "html_page",
           "overview_page", "to_bertviz", "save", "fit_maps", "MAX_WEIGHTS", "show", "MapsView"]
