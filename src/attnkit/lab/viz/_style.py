"""Shared plumbing for the pictures: lazy matplotlib, input checks, labels, colours, saving.

Figures are built as plain :class:`matplotlib.figure.Figure` objects on an Agg
canvas, never through ``pyplot``: nothing is registered in pyplot's global figure
list, so nothing leaks and no window ever opens, whatever backend the user's
session has selected.
"""

from __future__ import annotations

import functools
import math
import textwrap
from collections.abc import Sequence
from pathlib import Path

import torch

from ...errors import ArgumentError, DTypeError, ShapeError

__all__ = ["save", "new_figure", "as_weights", "checked", "check_path", "set_token_ticks", "title_lines", "drawable",
           "labels_or_recorded", "series_styles", "tick_budget", "MAX_TICK_LABELS"]

SUFFIXES = (".png", ".svg")
MAX_TICK_LABELS = 64
_LABEL_CHARS = 18


def matplotlib():
    """The matplotlib module, or an ImportError that says how to install it."""
    try:
        import matplotlib as mpl
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401  (Agg must be importable)
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError('attnkit.lab.viz needs matplotlib: pip install "attnkit[plot]"') from err
    return mpl


_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">")  # 11: with 10 colours, no pair repeats
_LINESTYLES = ("-", "--", "-.", ":")


def series_styles(n: int) -> list[dict]:
    """``n`` distinct line styles for plot(): a colour of tab10, a marker and a line style each.

    Colours repeat after 10 series, markers after 11, so no two of the first 110 series look alike;
    the line style changes every 10 series as well, for readers who cannot tell the colours apart.
    """
    cmap = matplotlib().colormaps["tab10"]
    return [{"color": cmap(i % 10), "marker": _MARKERS[i % len(_MARKERS)], "linestyle": _LINESTYLES[i // 10 % 4]}
            for i in range(n)]


def new_figure(width: float, height: float):
    """A pyplot-free Figure on an Agg canvas, with constrained layout."""
    matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def check_path(path, suffixes: Sequence[str] = SUFFIXES) -> Path | None:
    """``path`` as a Path (None stays None); ArgumentError for an unsupported suffix."""
    if path is None:
        return None
    path = Path(path)
    if path.suffix.lower() not in suffixes:
        raise ArgumentError(f"path must end in one of {', '.join(suffixes)}; got {str(path)!r}")
    return path


def save(fig, path) -> Path:
    """Write ``fig`` to ``path`` (PNG or SVG, chosen by the suffix) and return the Path.

    Parent folders are created. SVG output carries no date, so the same figure
    gives the same bytes.
    """
    path = check_path(path)
    if path is None:
        raise ArgumentError("save: path must be given")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".svg":
        fig.savefig(path, format="svg", metadata={"Date": None})
    else:
        fig.savefig(path, format="png", dpi=150)
    return path


def checked(weights, who: str, ranks: Sequence[int], shape_doc: str) -> torch.Tensor:
    """A tensor/array as a real tensor whose rank is one of ``ranks``, not copied (slice it before converting).

    NaN and inf are kept (they are drawn in a distinct colour); empty maps, complex
    values and unknown types are refused.
    """
    if not isinstance(weights, torch.Tensor):
        try:
            weights = torch.as_tensor(weights)
        except (TypeError, ValueError, RuntimeError) as err:
            raise DTypeError(f"{who}: expected a torch tensor or numpy array; got {type(weights).__name__}") from err
    if weights.is_complex():
        raise DTypeError(f"{who}: weights must be real; got dtype {weights.dtype}")
    if weights.dim() not in ranks:
        raise ShapeError(f"{who}: weights must have shape {shape_doc}; got {tuple(weights.shape)}")
    if weights.numel() == 0:
        raise ShapeError(f"{who}: nothing to draw, weights have shape {tuple(weights.shape)}")
    return weights


def as_weights(weights, who: str, ranks: Sequence[int], shape_doc: str) -> torch.Tensor:
    """A float64 CPU copy of a tensor/array whose rank is one of ``ranks`` (checked as :func:`checked`)."""
    return checked(weights, who, ranks, shape_doc).detach().to("cpu", torch.float64)


def check_labels(labels, n: int, who: str, name: str) -> list[str] | None:
    """``labels`` as a list of str of length ``n`` (None stays None)."""
    if labels is None:
        return None
    labels = [str(t) for t in labels]
    if len(labels) != n:
        raise ShapeError(f"{who}: {name} must have one label per position ({n}); got {len(labels)}")
    return labels


def labels_or_recorded(given, recorded: dict, side: int):
    """The labels a caller gave, else those a recording carries (``{name: (q_tokens, k_tokens)}``; ``side`` 0 for
    queries, 1 for keys) as a mapping name -> tokens, else None."""
    if given is not None or not recorded:
        return given
    return {name: pair[side] for name, pair in recorded.items() if pair[side] is not None}


@functools.lru_cache(maxsize=8)
def _glyphs(families: tuple[str, ...]) -> frozenset[int]:
    """Code points the fonts of ``font.family`` can draw: generic names expand to their rcParams list and
    every installed font there counts, as in matplotlib's own font fallback."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    rc, points = matplotlib().rcParams, set[int]()
    generic = ("sans-serif", "serif", "monospace", "cursive", "fantasy")
    names = [n for f in families for n in (rc[f"font.{f}"] if f in generic else [f])]
    for name in names:
        try:
            path = font_manager.findfont(font_manager.FontProperties(family=name), fallback_to_default=False)
        except ValueError:  # not installed
            continue
        points.update(FT2Font(path).get_charmap())
    return frozenset(points)


def drawable(text: str) -> str:
    """``text`` with every character the configured fonts lack written as ``U+XXXX`` (no tofu boxes, no
    warnings); configure a font that has them (``font.family``) to see the glyphs instead."""
    glyphs = _glyphs(tuple(matplotlib().rcParams["font.family"]))
    return "".join(c if ord(c) in glyphs or c.isspace() else f"U+{ord(c):04X}" for c in text)


def _plain(label: str) -> str:
    """A label matplotlib shows verbatim: no mathtext ($), short, one line, drawable."""
    label = label.replace("\n", " ")
    if len(label) > _LABEL_CHARS:
        label = label[: _LABEL_CHARS - 1] + "…"
    return drawable(label).replace("$", r"\$")


def title_lines(text: str, width_in: float, fontsize: float = 12.0, max_lines: int | None = None) -> str:
    """``text`` wrapped to fit a figure ``width_in`` inches wide, drawable and free of mathtext; at most
    ``max_lines`` lines (the last one ends in "…" where text was cut)."""
    chars = max(20, int(width_in * 72 / (0.6 * fontsize)))
    lines = textwrap.wrap(drawable(text), chars, break_on_hyphens=False)
    if max_lines is not None and len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][: chars - 1] + "…"
    return "\n".join(lines).replace("$", r"\$")


def tick_budget(length_in: float, fontsize: float) -> int:
    """How many labels fit along ``length_in`` inches of an axis at ``fontsize`` points without overlapping."""
    return max(2, int(length_in * 72 / (1.4 * fontsize)))


def set_token_ticks(ax, axis: str, labels: list[str] | None, n: int, max_labels: int = MAX_TICK_LABELS) -> None:
    """Token labels on one axis, every k-th one when there are more than ``max_labels``; whole indices without."""
    if labels is None:
        locator = matplotlib().ticker.MaxNLocator(integer=True, min_n_ticks=1)
        (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(locator)
        return
    step = math.ceil(n / max(1, min(max_labels, MAX_TICK_LABELS)))
    ticks = list(range(0, n, step))
    size = 9 if len(ticks) <= 24 else 7 if len(ticks) <= 40 else 6
    shown = [_plain(labels[i]) for i in ticks]
    if axis == "x":
        ax.set_xticks(ticks, shown, rotation=90, fontsize=size)
    else:
        ax.set_yticks(ticks, shown, fontsize=size)


def map_figsize(lq: int, lk: int, *, extra_w: float = 1.6, extra_h: float = 1.2) -> tuple[float, float]:
    """A size that gives small maps readable cells and keeps large ones on a page."""
    cell = 0.32 if max(lq, lk) <= 24 else 0.2 if max(lq, lk) <= 48 else 0.12
    w = min(max(lk * cell, 3.0), 11.0) + extra_w
    h = min(max(lq * cell, 2.6), 10.0) + extra_h
    return w, h


def finish(fig, path: Path | None):
    """Save when a path is given; the Figure is returned either way (it is not held by pyplot)."""
    if path is not None:
        save(fig, path)
    return fig
