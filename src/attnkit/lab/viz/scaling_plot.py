"""Measured cost against sequence length: time and peak memory on log-log axes, with O(L) and O(L^2) guides."""

from __future__ import annotations

import math
from collections.abc import Mapping

from ...errors import ArgumentError
from ._style import check_path, finish, matplotlib, new_figure, series_styles, title_lines

__all__ = ["scaling_plot"]

_GUIDE = dict(color="#9a9a9a", linewidth=1.0, alpha=0.6, zorder=0)


def _points(name: str, points) -> list[tuple[int, float, float | None]]:
    """Validated points of one series, sorted by length."""
    out = []
    for i, point in enumerate(points):
        try:
            length, seconds, peak = point
        except (TypeError, ValueError) as err:
            raise ArgumentError(f"scaling_plot: series[{name!r}][{i}] must be (L, seconds, peak_bytes | None); "
                                f"got {point!r}") from err
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ArgumentError(f"scaling_plot: series[{name!r}][{i}]: L must be an int >= 1; got {length!r}")
        seconds = _positive(name, i, "seconds", seconds)
        out.append((length, seconds, None if peak is None else _positive(name, i, "peak_bytes", peak)))
    if not out:
        raise ArgumentError(f"scaling_plot: series[{name!r}] has no points")
    return sorted(out)


def _positive(name: str, i: int, what: str, value) -> float:
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not (math.isfinite(number) and number > 0):
        raise ArgumentError(f"scaling_plot: series[{name!r}][{i}]: {what} must be a finite number > 0 "
                            f"(log axes); got {value!r}")
    return number


def _guides(ax, xs: list[int], ys: list[float]) -> None:
    """Faint lines of slope 1 and 2 through the geometric mean of the values at the smallest length."""
    lo, hi = min(xs), max(xs)
    if lo == hi:
        return
    at_lo = [y for x, y in zip(xs, ys, strict=True) if x == lo]
    y0 = math.exp(sum(math.log(y) for y in at_lo) / len(at_lo))
    for power, style, label in ((1, "--", "∝ L"), (2, ":", "∝ L²")):
        ax.plot([lo, hi], [y0, y0 * (hi / lo) ** power], style, label=label, **_GUIDE)
        ax.annotate(label, (hi, y0 * (hi / lo) ** power), textcoords="offset points", xytext=(-2, 5),
                    fontsize=8, color="#707070", ha="right", va="bottom")


def _panel(ax, data, column: int, ylabel: str, scale: float) -> None:
    xs, ys = [], []
    for style, (name, points) in zip(data["styles"], data["series"].items(), strict=True):
        pts = [(p[0], p[column] / scale) for p in points if p[column] is not None]
        if pts:
            ax.plot(*zip(*pts, strict=True), label=name, markersize=4, linewidth=1.6, **style)
            xs += [p[0] for p in pts]
            ys += [p[1] for p in pts]
    if not xs:
        ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center", va="center", color="#777777")
        ax.set_yticks([])
        ax.set_xticks([])
    else:
        _guides(ax, xs, ys)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        mpl = matplotlib()
        ax.xaxis.set_major_formatter(mpl.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.grid(True, which="major", alpha=0.25)
    ax.set_xlabel("sequence length L")
    ax.set_ylabel(ylabel)


def scaling_plot(series, *, path=None, title=None):
    """Time and peak memory against sequence length, one line per mechanism, log-log.

    Faint reference lines of slope 1 (``∝ L``) and 2 (``∝ L²``) are drawn through the
    measurements at the smallest length, so a mechanism's complexity can be read off
    by which guide its line runs parallel to.

    Args:
        series: ``Mapping[str, Sequence[(L, seconds, peak_bytes | None)]]``; seconds and
            peak bytes must be > 0 (log axes); a series without memory is left out of
            the memory panel.
        path: ``.png`` or ``.svg`` file to write.
        title: figure title (wrapped to the width); say what was measured and at which sizes.

    Returns:
        The Figure (two axes: time, memory). Each series has its own colour, marker and line style.

    Example:
        >>> from attnkit.lab.viz import scaling_plot
        >>> fig = scaling_plot({"dense": [(256, 1e-3, 2**20), (512, 4e-3, 2**22)]})
        >>> [ax.get_ylabel() for ax in fig.axes]
        ['time per call (s)', 'peak memory (MiB)']
    """
    path = check_path(path)
    if not isinstance(series, Mapping) or not series:
        raise ArgumentError(f"scaling_plot: series must be a non-empty mapping name -> points; "
                            f"got {type(series).__name__}")
    data = {"series": {str(k): _points(str(k), v) for k, v in series.items()}}
    data["styles"] = series_styles(len(data["series"]))
    fig = new_figure(11.0, 4.4)
    time_ax, mem_ax = fig.subplots(1, 2)
    _panel(time_ax, data, 1, "time per call (s)", 1.0)
    _panel(mem_ax, data, 2, "peak memory (MiB)", 2.0**20)
    handles, labels = time_ax.get_legend_handles_labels()
    time_ax.legend(handles, labels, fontsize=8, loc="upper left")
    if title:
        fig.suptitle(title_lines(str(title), fig.get_figwidth(), 11), fontsize=11)
    return finish(fig, path)
