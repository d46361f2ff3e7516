"""Colour scales of attention maps, and drawing one map with its scale.

``scale`` picks how weights become colours (viridis, NaN and inf in light grey):

    linear  0 .. the largest weight: faithful, but a long map's weights (most near 1/L) look black
    log     the largest weight down to 10^-3 of it, logarithmically: a 512-token map's spread shows
    row     each query row divided by its own largest weight: where every query looks, whatever its peak

A map holding negative values (raw scores) is always drawn on a symmetric diverging linear
scale: neither a logarithm nor a row maximum means anything there.
"""

from __future__ import annotations

import torch

from ...errors import ArgumentError
from ._style import matplotlib

__all__ = ["SCALES", "DEFAULT_SCALE", "LOG_DECADES", "check_scale", "weight_norm", "scaled", "draw_map"]

SCALES = ("linear", "log", "row")
DEFAULT_SCALE = "log"  # the pages, the grid and the command line: a long map's weights (near 1/L) stay visible
LOG_DECADES = 3  # the log scale spans the largest weight down to 10^-3 of it
WEIGHTS_CMAP = "viridis"  # sequential, perceptually uniform, readable in grey scale
SCORES_CMAP = "RdBu_r"  # diverging, used only when a map holds negative values (raw scores)


def check_scale(who: str, scale) -> str:
    if scale not in SCALES:
        raise ArgumentError(f"{who}: scale must be one of {', '.join(map(repr, SCALES))}; got {scale!r}")
    return scale


def weight_norm(values: torch.Tensor):
    """(cmap, vmin, vmax): 0..max for weights, a symmetric diverging scale if any value is negative."""
    finite = values[torch.isfinite(values)]
    if finite.numel() == 0:
        return WEIGHTS_CMAP, 0.0, 1.0
    lo, hi = finite.min().item(), finite.max().item()
    if lo < 0:
        bound = max(-lo, hi, 1e-12)
        return SCORES_CMAP, -bound, bound
    return WEIGHTS_CMAP, 0.0, hi if hi > 0 else 1.0


def _row_max(values: torch.Tensor) -> torch.Tensor:
    finite = torch.where(torch.isfinite(values), values, torch.zeros_like(values))
    return finite.amax(-1, keepdim=True)


def scaled(values: torch.Tensor, scale: str):
    """``(values to draw, cmap, norm, colour bar label)`` for maps ``(..., Lq, Lk)`` that share one colour scale."""
    colors = matplotlib().colors
    cmap, vmin, vmax = weight_norm(values)
    if scale == "linear" or vmin < 0:
        return values, cmap, colors.Normalize(vmin, vmax), "weight" if vmin >= 0 else "score"
    if scale == "log":
        floor = vmax * 10.0 ** -LOG_DECADES
        return values.clamp(min=floor), cmap, colors.LogNorm(floor, vmax), "weight (log)"
    top = _row_max(values)
    shown = torch.where(top > 0, values / torch.where(top > 0, top, torch.ones_like(top)), torch.zeros_like(values))
    return torch.where(torch.isfinite(values), shown, values), cmap, colors.Normalize(0.0, 1.0), "weight / row max"


def _cmap_with_bad(name: str):
    """The named colormap with NaN/inf drawn in light grey."""
    return matplotlib().colormaps[name].with_extremes(bad="#c8c8c8")


def draw_map(ax, values: torch.Tensor, cmap: str, norm, size: tuple[int, int] | None = None):
    """imshow of a (Lq, Lk) map with NaN/inf masked, one square cell per entry.

    ``size``: the ``(Lq, Lk)`` the axes count in when ``values`` is a pooled picture of a longer
    map (its cells then span several positions; ticks stay positions).
    """
    import numpy as np

    data = np.ma.masked_invalid(values.numpy())
    lq, lk = size or values.shape
    aspect = "equal" if max(lq, lk) <= 4 * min(lq, lk) else "auto"  # square cells unless a strip
    return ax.imshow(data, cmap=_cmap_with_bad(cmap), norm=norm, interpolation="nearest", aspect=aspect,
                     extent=(-0.5, lk - 0.5, lq - 0.5, -0.5))
