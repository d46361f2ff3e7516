"""Pictures of attention: maps, head grids, alignments, mask patterns, scaling plots, an offline HTML page.

matplotlib is an optional extra (``pip install 'attnkit[plot]'``), imported only
when a picture is drawn; figures are drawn on an Agg canvas outside pyplot, so
they work headless and never leak. :func:`html_page` needs no matplotlib at all.
"""

from ._style import save
from .html import html_page
from .maps import alignment, head_grid, heatmap
from .patterns import mask_density, mask_picture
from .scaling_plot import scaling_plot

__all__ = ["heatmap", "head_grid", "alignment", "mask_picture", "mask_density", "scaling_plot", "html_page", "save"]
