"""Attention maps as pictures: one map, a grid of heads per layer, a seq2seq alignment.

Weights are drawn with a sequential colour map (viridis) on a linear, logarithmic or
per-row scale (:mod:`._scale`); a map holding negative values (raw scores) gets a
symmetric diverging scale instead. NaN and inf are allowed and drawn in light grey: a
picture is often how a NaN is found, so refusing it would hide exactly what one wants
to see. Maps longer than a panel has pixels are pooled to its resolution first
(:mod:`._pool`: rows keep their sums), and tick labels are thinned to what the panel fits.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ...errors import ShapeError, check_int
from ..analysis.model_maps import maps_and_tokens
from ._pool import pool
from ._scale import DEFAULT_SCALE, check_scale, draw_map, scaled
from ._style import (
    as_weights,
    check_labels,
    check_path,
    checked,
    finish,
    labels_or_recorded,
    map_figsize,
    new_figure,
    set_token_ticks,
    tick_budget,
    title_lines,
)

__all__ = ["heatmap", "head_grid", "alignment"]


def heatmap(weights, *, q_labels=None, k_labels=None, title=None, path=None, ax=None, scale="linear"):
    """Draw one attention map ``(Lq, Lk)``: queries down, keys across, with a colour bar.

    Args:
        weights: tensor or array ``(Lq, Lk)``; NaN/inf are drawn grey.
        q_labels, k_labels: one token label per query / key (long lists are thinned).
        title: axes title.
        path: ``.png`` or ``.svg`` file to write (the suffix picks the format).
        ax: draw into this matplotlib Axes instead of a new figure.
        scale: ``"linear"``, ``"log"`` (three decades below the largest weight) or ``"row"`` (each query
            row over its largest weight).

    Returns:
        The Figure (``ax.figure`` when ``ax`` is given), which pyplot does not hold.

    Example:
        >>> import torch
        >>> from attnkit.lab.viz import heatmap
        >>> fig = heatmap(torch.softmax(torch.randn(3, 4), -1), q_labels="abc", k_labels="wxyz")
        >>> [t.get_text() for t in fig.axes[0].get_xticklabels()]
        ['w', 'x', 'y', 'z']
    """
    path = check_path(path)
    scale = check_scale("heatmap", scale)
    w = as_weights(weights, "heatmap", (2,), "(Lq, Lk)")
    lq, lk = w.shape
    q_labels = check_labels(q_labels, lq, "heatmap", "q_labels")
    k_labels = check_labels(k_labels, lk, "heatmap", "k_labels")
    if ax is None:
        fig = new_figure(*map_figsize(lq, lk))
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    data, cmap, norm, label = scaled(w, scale)
    image = draw_map(ax, data, cmap, norm)
    fig.colorbar(image, ax=ax, shrink=0.8, label=label)
    set_token_ticks(ax, "x", k_labels, lk)
    set_token_ticks(ax, "y", q_labels, lq)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    if title:
        ax.set_title(title_lines(str(title), fig.get_figwidth()))
    return finish(fig, path)


def _heads(name: str, value, max_heads: int | None):
    """A map value as float64 (H, Lq, Lk), at most ``max_heads`` heads: (Lq, Lk) is one head; (B, H, Lq, Lk) keeps
    sample 0. Sliced before the copy, so a long batch or many heads cost nothing beyond what is drawn."""
    w = checked(value, f"head_grid: maps[{name!r}]", (2, 3, 4), "(Lq, Lk), (H, Lq, Lk) or (B, H, Lq, Lk)")
    w = w[None] if w.dim() == 2 else w[0] if w.dim() == 4 else w
    return w[:max_heads].detach().to("cpu", torch.float64), w.shape[0]


def _row_label(name: str, row_in: float) -> str:
    """A row's map name broken after dots (``decoder.layers.0.`` / ``multihead_attn``) to fit its height."""
    chars, lines = max(8, int(row_in * 72 / (0.6 * 9))), [""]
    for part in name.replace(".", ".\0").split("\0"):
        if lines[-1] and len(lines[-1]) + len(part) > chars:
            lines.append("")
        lines[-1] += part
    return "\n".join(title_lines(line, row_in, 9) for line in lines)


def _row_tokens(tokens, name: str, n: int, arg: str) -> list[str] | None:
    """One row's labels: a shared sequence, or a mapping map name -> sequence (None: no labels)."""
    if isinstance(tokens, Mapping):
        tokens = tokens.get(name)
    return check_labels(tokens, n, f"head_grid: maps[{name!r}]", arg)


def _label_first_head(ax, name: str, w: torch.Tensor, q_tokens, k_tokens, row_in: float, panel: float) -> None:
    """The axes of a row's first head: its tokens (or positions, as many as ``panel`` inches fit) and what each
    axis is, with its length."""
    _, lq, lk = w.shape
    q = _row_tokens(q_tokens, name, lq, "q_tokens")
    k = _row_tokens(k_tokens, name, lk, "k_tokens")
    set_token_ticks(ax, "x", k, lk, tick_budget(panel, 7))
    set_token_ticks(ax, "y", q, lq, tick_budget(panel, 7))
    ax.tick_params(labelsize=7)
    ax.set_xlabel(f"key ({lk})", fontsize=8)
    ax.set_ylabel(f"{_row_label(name, row_in)}\nquery ({lq})", fontsize=9)


def _panel_inches(fig, ax) -> float:
    """The shorter side of ``ax`` in inches once the layout has placed everything (labels, colour bars)."""
    fig.get_layout_engine().execute(fig)
    box = ax.get_position()
    return min(box.width * fig.get_figwidth(), box.height * fig.get_figheight())


def head_grid(maps, *, path=None, title=None, max_heads=None, q_tokens=None, k_tokens=None, scale=DEFAULT_SCALE,
              max_size=None):
    """Draw every head of every layer: one row per map name, one column per head.

    Each row shares one colour scale (its own colour bar), so heads of a layer can be
    compared; rows are scaled independently. The first head of each row carries the
    axes: keys across, queries down, with their tokens (or positions: as many as the
    panel fits) and lengths; the title (at most three lines) adds the number of maps and
    heads and the map sizes. A map longer than its panel has pixels (150 per inch) is
    pooled to that resolution first, its rows keeping their sums, so thin patterns (a
    diagonal) neither vanish nor alias.

    Args:
        maps: ``Mapping[str, tensor]``, each ``(H, Lq, Lk)``; ``(Lq, Lk)`` is one head and
            ``(B, H, Lq, Lk)`` is drawn for sample 0. Rows may differ in H, Lq and Lk. Also an
            :class:`~attnkit.lab.analysis.AttentionRecorder` (its tokens label the rows) or a
            transformers model's ``outputs.attentions`` (one ``(B, H, Lq, Lk)`` per layer) or output.
        path: ``.png`` or ``.svg`` file to write.
        title: figure title.
        max_heads: draw only the first this many heads of each row.
        q_tokens, k_tokens: query / key labels, one sequence for every row or a mapping map
            name -> tokens; a recording's own tokens where none are given.
        scale: ``"log"`` (default, as ``attnkit record``: the largest weight down to 10^-3 of it, so the
            many near-1/L weights of a long map stay visible), ``"linear"`` or ``"row"`` (as :func:`heatmap`).
        max_size: pool every map to at most this many cells per axis (default: the panel's pixels).

    Returns:
        The Figure.

    Example:
        >>> import torch
        >>> from attnkit.lab.viz import head_grid
        >>> maps = {"layer 0": torch.rand(3, 5, 7), "layer 1": torch.rand(2, 5, 7)}
        >>> fig = head_grid(maps)
        >>> sum(ax.get_label() == "head" for ax in fig.axes)
        5
    """
    path = check_path(path)
    scale = check_scale("head_grid", scale)
    maps, found = maps_and_tokens(maps, "head_grid")
    q_tokens, k_tokens = labels_or_recorded(q_tokens, found, 0), labels_or_recorded(k_tokens, found, 1)
    for name, value in (("max_heads", max_heads), ("max_size", max_size)):
        if value is not None:
            check_int("head_grid", name, value, 1)
    heads = {str(name): _heads(str(name), value, max_heads) for name, value in maps.items()}
    rows = {name: w for name, (w, _) in heads.items()}
    total = max(h for _, h in heads.values())
    ncols = max(w.shape[0] for w in rows.values())
    panel, extra = 1.9, 0.0  # inches per head; tokens need room: a cell per token label, the labels beside
    if q_tokens is not None or k_tokens is not None:
        longest = max(max(w.shape[1:]) for w in rows.values())
        panel, extra = min(max(1.9, 0.15 * longest), 4.2), 0.7
    # A panel's side: what the widest (22 in) and tallest (24 in) figure leave to each head, at most ``panel``;
    # the figure is then made to hold exactly those panels, so a wide grid leaves no empty bands between rows.
    side = min(panel, (22.0 - 1.4 - extra) / ncols, (24.0 - 0.8) / len(rows) - extra)
    width, height = max(side * ncols + 1.4 + extra, 4.5), (side + extra) * len(rows) + 0.8
    fig = new_figure(width, height)
    grid = fig.subplots(len(rows), ncols, squeeze=False)
    row_in = (height - 0.8) / len(rows)
    shown_in = min((width - 1.4 - extra) / ncols, row_in - extra)  # a panel's side as drawn
    for r, (name, w) in enumerate(rows.items()):
        data, cmap, norm, label = scaled(pool(w[:ncols], max_size or max(8, int(shown_in * 150)))[0], scale)
        image = None
        for h in range(ncols):
            ax = grid[r][h]
            if h >= w.shape[0]:
                ax.set_axis_off()
                continue
            image = draw_map(ax, data[h], cmap, norm, size=tuple(w.shape[1:]))
            ax.set_label("head")
            ax.set_xticks([])
            ax.set_yticks([])
            if h == 0:
                _label_first_head(ax, name, w, q_tokens, k_tokens, row_in, shown_in)
            if r == 0 or h >= rows[list(rows)[r - 1]].shape[0]:
                ax.set_title(f"head {h}", fontsize=9)
        fig.colorbar(image, ax=list(grid[r]), shrink=0.85, aspect=12, label=label)
    shown = f"first {ncols} of {total} heads" if ncols < total else f"{total} head{'s' * (total > 1)}"
    sizes = sorted({tuple(w.shape[1:]) for w in rows.values()})
    shapes = ", ".join(f"{lq} queries x {lk} keys" for lq, lk in sizes)
    suffix = f"{len(rows)} map{'s' * (len(rows) > 1)}, {shown}, {shapes}"
    fig.suptitle(title_lines(f"{title}: {suffix}" if title else suffix, width, 11, max_lines=3), fontsize=11)
    panel = _panel_inches(fig, grid[0][0])  # the labels set above used an estimate: thin them to the real panel
    for r, (name, w) in enumerate(rows.items()):
        _label_first_head(grid[r][0], name, w, q_tokens, k_tokens, row_in, panel)
    return finish(fig, path)


def alignment(weights, src_tokens, tgt_tokens, *, path=None, title=None):
    """Draw a seq2seq alignment ``(T, S)``: source tokens across the top, target tokens down.

    The layout of Bahdanau et al., "Neural Machine Translation by Jointly Learning to
    Align and Translate" (ICLR 2015, arXiv:1409.0473), Fig. 3: entry ``(t, s)`` is the
    weight alpha_ts of source word s when target word t was produced.

    Args:
        weights: tensor or array ``(T, S)`` (target length, source length).
        src_tokens: S source tokens (x axis).
        tgt_tokens: T target tokens (y axis).
        path: ``.png`` or ``.svg`` file to write.
        title: axes title.

    Returns:
        The Figure.

    Example:
        >>> import torch
        >>> from attnkit.lab.viz import alignment
        >>> fig = alignment(torch.eye(2), ["a", "b"], ["x", "y"])
        >>> fig.axes[0].get_xlabel(), fig.axes[0].get_ylabel()
        ('source', 'target')
    """
    path = check_path(path)
    w = as_weights(weights, "alignment", (2,), "(T, S) = (target length, source length)")
    t_len, s_len = w.shape
    src = check_labels(src_tokens, s_len, "alignment", "src_tokens")
    tgt = check_labels(tgt_tokens, t_len, "alignment", "tgt_tokens")
    if src is None or tgt is None:
        raise ShapeError("alignment: src_tokens and tgt_tokens are required")
    fig = heatmap(w, q_labels=tgt, k_labels=src, title=title)
    ax = fig.axes[0]
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("source")
    ax.set_ylabel("target")
    return finish(fig, path)
