"""Pictures of masks: which (query, key) pairs may attend, and which blocks a block-sparse kernel computes.

Colours: an allowed entry is navy, a masked one white. With a block layout the
colours also say what the block-sparse kernel does there: allowed entries of a
*full* block (every entry allowed, the mask is not even evaluated) are green,
masked entries of a *partial* block (computed, then masked) light orange, and
*skipped* blocks (never computed) light grey. In an exact picture an allowed
entry in a skipped block, or a masked one in a full block, would be a layout bug:
those are drawn red. Large masks are drawn downsampled (see ``_mask_eval``).
"""

from __future__ import annotations

import torch

from ...errors import check_int
from ._mask_eval import as_mask, block_states, element_fraction, element_view
from ._style import check_path, finish, matplotlib, new_figure, set_token_ticks, title_lines

__all__ = ["mask_picture", "mask_density"]

ALLOWED, MASKED = "#253494", "#ffffff"
# Per block state (0 skipped, 1 partial, 2 full): colour of allowed entries, of masked entries.
ALLOWED_IN = ("#d7191c", ALLOWED, "#1b7837")
MASKED_IN = ("#e6e6e6", "#fdd49e", "#f4a6a6")
BAD = ("allowed entry in a skipped block", "masked entry in a full block")


def mask_density(mask, q_len: int, kv_len: int | None = None, *, block_size: int | None = None) -> float:
    """Block density (fraction of active blocks) with a block size, else the fraction of allowed entries.

    The entry fraction is exact while ``q_len * kv_len <= 16M`` and a sampled estimate beyond.

    Example:
        >>> mask_density("causal()", 4)
        0.625
        >>> mask_density("causal()", 4, block_size=2)
        0.75
    """
    m, kv_len = as_mask(mask, q_len, kv_len)
    if block_size is not None:
        return block_states(m, q_len, kv_len, check_int("mask_picture", "block_size", block_size, 1))[1]
    return element_fraction(*element_view(m, q_len, kv_len), q_len, kv_len)


def _rgb(colours) -> torch.Tensor:
    mpl = matplotlib()
    return torch.tensor([mpl.colors.to_rgb(c) for c in colours], dtype=torch.float64)


def _cell_states(states: torch.Tensor, cells: tuple[int, int], factors, lengths, block_size: int):
    """Block state at the centre entry of each drawn cell, (cells_q, cells_k)."""
    idx = [((torch.arange(n) * f + f // 2).clamp(max=length - 1) // block_size)
           for n, f, length in zip(cells, factors, lengths, strict=True)]
    return states[idx[0][:, None], idx[1][None, :]]


def compose(view: torch.Tensor, cell_states: torch.Tensor | None, exact: bool) -> torch.Tensor:
    """RGB image (cells_q, cells_k, 3): each cell blends its allowed and masked colours by the fraction allowed."""
    frac = view.double()[..., None]
    if cell_states is None:
        allowed, masked = _rgb([ALLOWED]), _rgb([MASKED])
    else:
        # Downsampled cells may straddle blocks: no red flags there, only in exact pictures.
        allowed_in = ALLOWED_IN if exact else (ALLOWED, *ALLOWED_IN[1:])
        masked_in = MASKED_IN if exact else (*MASKED_IN[:2], MASKED_IN[1])
        allowed, masked = _rgb(allowed_in)[cell_states], _rgb(masked_in)[cell_states]
    return frac * allowed + (1 - frac) * masked


def _legend(ax, view, cell_states, states, exact: bool) -> None:
    patch = matplotlib().patches.Patch
    if states is None:
        handles = [patch(facecolor=ALLOWED, label="may attend"),
                   patch(facecolor=MASKED, edgecolor="#999999", label="masked")]
    else:
        n = [int((states == s).sum()) for s in range(3)]
        handles = [patch(facecolor=ALLOWED_IN[2], label=f"full block, all allowed ({n[2]})"),
                   patch(facecolor=ALLOWED, label="partial block: may attend"),
                   patch(facecolor=MASKED_IN[1], label=f"partial block: masked ({n[1]})"),
                   patch(facecolor=MASKED_IN[0], label=f"skipped block ({n[0]})")]
        if exact and ((view > 0) & (cell_states == 0)).any() | ((view < 1) & (cell_states == 2)).any():
            handles.append(patch(facecolor=ALLOWED_IN[0], label="layout error: " + " / ".join(BAD)))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)


def _grid(ax, shape, block_size: int) -> None:
    nq, nk = shape
    if max(nq, nk) <= 32:  # beyond that the lines would cover the picture
        edges = dict(colors="#5a5a5a", linewidths=0.5, alpha=0.6)
        ax.hlines([i * block_size - 0.5 for i in range(1, nq)], -0.5, nk * block_size - 0.5, **edges)
        ax.vlines([j * block_size - 0.5 for j in range(1, nk)], -0.5, nq * block_size - 0.5, **edges)


def _figsize(q_len: int, kv_len: int, legend: float) -> tuple[float, float]:
    """Width and height in inches: the picture keeps the mask's aspect (within 1:8), the longer side 5.2 in."""
    ratio = min(max(kv_len / q_len, 1 / 8), 8)  # width / height of the picture
    w, h = (5.2, 5.2 / ratio) if ratio >= 1 else (5.2 * ratio, 5.2)
    return max(w, 2.4) + legend + 1.0, max(h, 0.9) + 1.6


def mask_picture(mask, q_len, kv_len=None, *, block_size=None, path=None, title=None):
    """Draw a mask (sample 0, head 0) and, with ``block_size``, its block layout.

    With a block size, entries are coloured by what the block-sparse kernel does with
    their block (see the module notes: green full, orange partial, grey skipped), the
    block grid is outlined, and the block density (fraction of active blocks) goes in
    the title. Up to 512 x 512 each entry is one cell; larger masks are drawn
    downsampled, shading each cell by its fraction of allowed entries, and never
    materialise more than 16M entries.

    Args:
        mask: an :class:`attnkit.masks.Mask`, a bool tensor ``(q_len, kv_len)`` (True =
            attend) or an expression such as ``"causal() & sliding_window(64, 0)"``.
        q_len: number of queries.
        kv_len: number of keys (default: ``q_len``; a tensor's own width).
        block_size: block size of the layout overlay.
        path: ``.png`` or ``.svg`` file to write.
        title: title (default: the mask's description).

    Returns:
        The Figure; its image artist has gid ``"mask"``.

    Example:
        >>> from attnkit.lab.viz import mask_picture
        >>> fig = mask_picture("causal()", 8, block_size=4)
        >>> "block density 0.750" in fig.axes[0].get_title()
        True
    """
    path = check_path(path)
    m, kv_len = as_mask(mask, q_len, kv_len)
    if block_size is not None:
        check_int("mask_picture", "block_size", block_size, 1)
    view, fq, fk = element_view(m, q_len, kv_len)
    exact = fq == fk == 1
    detail = f"{q_len} queries x {kv_len} keys"
    if not exact:
        detail += f", {fq}x{fk} entries per cell, shaded by the fraction allowed"
    states = cell_states = None
    if block_size is not None:
        states, density = block_states(m, q_len, kv_len, block_size)
        cell_states = _cell_states(states, view.shape, (fq, fk), (q_len, kv_len), block_size)
        detail += f"; block size {block_size}: block density {density:.3f}"
    fig = new_figure(*_figsize(q_len, kv_len, legend=2.6 if block_size else 1.6))
    ax = fig.add_subplot()
    ax.imshow(compose(view, cell_states, exact).numpy(), interpolation="nearest", gid="mask",
              extent=(-0.5, view.shape[1] * fk - 0.5, view.shape[0] * fq - 0.5, -0.5))
    if states is not None:
        _grid(ax, states.shape, block_size)
    ax.set_xlim(-0.5, kv_len - 0.5)
    ax.set_ylim(q_len - 0.5, -0.5)
    ax.set_xlabel("key index")
    ax.set_ylabel("query index")
    set_token_ticks(ax, "x", None, kv_len)  # whole indices only
    set_token_ticks(ax, "y", None, q_len)
    text = title_lines(str(title) if title else repr(m), fig.get_figwidth(), 9)
    ax.set_title(f"{text}\n{title_lines(detail, fig.get_figwidth(), 9)}", fontsize=9)
    _legend(ax, view, cell_states, states, exact)
    return finish(fig, path)
