"""Pathfinder: are the two marked pixels joined by a curvy path, among other paths, in a small image?"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import ArgumentError, check_int
from .base import Task, check_float, register
from .pixels import resolve_side

__all__ = ["Pathfinder"]

BACKGROUND, PATH, MARK = 0, 1, 2
"""Pixel levels; token ids are levels + 1."""

_STEPS = torch.tensor([(0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1)])  # 8 headings
_CANDIDATES = 4  # drawn per missing example per round


def _grow(region: torch.Tensor) -> torch.Tensor:
    """``region (..., s, s)`` bool grown by one pixel in the 8 directions (3x3 dilation)."""
    out = region.clone()
    out[..., 1:] |= region[..., :-1]
    out[..., :-1] |= region[..., 1:]
    rows = out.clone()
    out[..., 1:, :] |= rows[..., :-1, :]
    out[..., :-1, :] |= rows[..., 1:, :]
    return out


def _fold(x: torch.Tensor, side: int) -> torch.Tensor:
    """Coordinates on the integer line mirrored into ``0 .. side - 1`` (a walk bounces off the edges)."""
    r = x % (2 * side)
    return torch.where(r >= side, 2 * side - 1 - r, r)


@register
@dataclass(frozen=True)
class Pathfinder(Task):
    """Say whether two marked pixels lie on one connected curve, with other curves around, read pixel by pixel.

    Linsley et al. 2018, "Learning long-range spatial dependencies with horizontal gated recurrent
    units", NeurIPS, arXiv:1805.08315 (Pathfinder); Long Range Arena's fifth task (Tay et al. 2021,
    arXiv:2011.04006, Sec. 3.5: 32x32 images as 1024 tokens). Each image holds two curves of
    ``path_length`` steps and ``distractors`` shorter curves of ``distractor_length`` steps, each a
    random walk over the 8 neighbouring pixels that keeps its heading or turns by 45 degrees
    (probability ``turn`` each way) and bounces off the edges. Two pixels are marked: the start of
    curve 1 and, for label 1, its end; for label 0, the end of curve 2. The label is recomputed by
    flood fill over the drawn pixels (8-connectivity); images where that disagrees (curves that
    touch) or where the marks are neighbours are drawn again, so the label is exactly
    "the marks are 8-connected through drawn pixels", and classes are balanced.

    What it tests: following a curve across the image. Why it needs long range: the marks are
    typically ``side / 2`` pixels apart, hundreds of tokens in the row-major sequence, and the
    answer depends on every pixel of the curve between them. Token counts do not decide it: both
    classes draw the same curves and two marks; only where the second mark sits differs.

    Token ids: background 1, curve 2, mark 3 (levels + 1; ``vocab_size`` 4, 0 = padding unused).

    Shapes:
        ``inputs (n, length)`` long, ``length = side^2`` row-major; ``targets (n,)`` in {0, 1};
        ``marks (n, 2, 2)`` the (row, column) of both marks.

    Complexity: ``O(n side^2 path_length)`` per batch (the walks and the flood fill), vectorised;
    about two draws per negative example.

    Args:
        length: tokens per image, a square (default ``side^2``).
        side: image side (>= 8; give ``length`` or ``side``; default 32).
        path_length: steps of each of the two curves (default ``side + side // 4``).
        distractors: extra curves without marks.
        distractor_length: steps of each extra curve (default ``side // 4``, at most ``path_length``).
        turn: probability of a 45-degree turn each way per step, in [0, 0.5].

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("pathfinder", side=16)
        >>> batch = task.sample(4, generator=torch.Generator().manual_seed(0))
        >>> batch["inputs"].shape, (batch["inputs"] == 3).sum(1).tolist(), sorted(batch["targets"].tolist())
        (torch.Size([4, 256]), [2, 2, 2, 2], [0, 0, 1, 1])
    """

    name: ClassVar[str] = "pathfinder"
    kind: ClassVar[str] = "classify"
    vocab_size: ClassVar[int] = 4

    length: int | None = None
    side: int | None = None
    path_length: int | None = None
    distractors: int = 4
    distractor_length: int | None = None
    turn: float = 0.25

    def __post_init__(self):
        length, side = resolve_side("Pathfinder", self.length, self.side, smallest=8)
        object.__setattr__(self, "length", length)
        object.__setattr__(self, "side", side)
        if self.path_length is None:
            object.__setattr__(self, "path_length", side + side // 4)
        check_int("Pathfinder", "path_length", self.path_length, 2)
        if self.distractor_length is None:
            object.__setattr__(self, "distractor_length", min(side // 4, self.path_length))
        check_int("Pathfinder", "distractors", self.distractors, 0)
        check_int("Pathfinder", "distractor_length", self.distractor_length, 1)
        if self.distractor_length > self.path_length:
            raise ArgumentError(f"Pathfinder: distractor_length must be <= path_length = {self.path_length}; "
                                f"got {self.distractor_length}")
        check_float("Pathfinder", "turn", self.turn, 0.0, 0.5)

    @property
    def num_classes(self) -> int:
        return 2

    def _walks(self, n: int, g) -> torch.Tensor:
        """``(n, 2 + distractors, path_length + 1, 2)`` pixel positions of every curve (all walked to full length).

        Heading: a random start, then per step +-45 degrees with probability ``turn`` each; the
        position is the sum of the steps, mirrored at the edges (a step into an edge stays put on
        that axis, so consecutive pixels are always 8-neighbours).
        """
        curves, steps = 2 + self.distractors, self.path_length
        u = torch.rand(n, curves, steps, generator=g)
        turns = (u < self.turn).long() - (u >= 1 - self.turn).long()
        heading = (torch.randint(0, 8, (n, curves, 1), generator=g) + turns.cumsum(2)) % 8
        start = torch.randint(0, self.side, (n, curves, 1, 2), generator=g)
        path = torch.cat([start, start + _STEPS[heading].cumsum(2)], 2)
        return _fold(path, self.side)

    def _draw(self, n: int, labels: torch.Tensor, g) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Candidate ``(levels (n, s, s), marks (n, 2, 2), valid (n,))`` for the intended ``labels``.

        Curves are 8-connected along themselves, so two marks are joined exactly when the graph
        "curve a has a pixel next to (or on) a pixel of curve b" links the mark's curves.
        """
        s, curves, rows = self.side, 2 + self.distractors, torch.arange(n)
        walks = self._walks(n, g)
        kept = torch.full((curves,), self.distractor_length + 1)
        kept[:2] = self.path_length + 1
        on = torch.arange(self.path_length + 1) < kept.view(curves, 1)  # (curves, steps + 1)
        pixel = walks[..., 0] * s + walks[..., 1]
        occupied = torch.zeros(n, curves, s * s).scatter_(2, pixel, on.expand(n, -1, -1).float())
        near = _grow(occupied.view(n, curves, s, s) > 0).view(n, curves, s * s).float()
        link = (near @ occupied.transpose(1, 2) > 0) | torch.eye(curves, dtype=torch.bool)
        for _ in range(max(1, (curves - 1).bit_length())):  # transitive closure by squaring
            link = (link.float() @ link.float()) > 0
        start = walks[:, 0, 0]
        end = torch.where(labels.view(n, 1) == 1, walks[:, 0, -1], walks[:, 1, -1])
        joined = (labels == 1) | link[:, 0, 1]
        apart = (start - end).abs().amax(1) >= 2
        levels = (occupied.amax(1) > 0).long().view(n, s, s) * PATH
        levels[rows, start[:, 0], start[:, 1]] = MARK
        levels[rows, end[:, 0], end[:, 1]] = MARK
        return levels, torch.stack([start, end], 1), (joined == (labels == 1)) & apart

    def _sample(self, n, generator):
        g, s = generator, self.side
        labels = (torch.arange(n) % 2)[torch.randperm(n, generator=g)]
        levels = torch.zeros(n, s, s, dtype=torch.long)
        marks = torch.zeros(n, 2, 2, dtype=torch.long)
        todo = torch.ones(n, dtype=torch.bool)
        for _ in range(1000):
            index = todo.nonzero().view(-1)
            wanted = labels[index].repeat_interleave(_CANDIDATES)
            new_levels, new_marks, valid = self._draw(len(wanted), wanted, g)
            valid = valid.view(-1, _CANDIDATES)
            found = valid.any(1)
            pick = valid.long().argmax(1) + _CANDIDATES * torch.arange(len(index))  # first valid candidate
            levels[index[found]], marks[index[found]] = new_levels[pick[found]], new_marks[pick[found]]
            todo[index[found]] = False
            if not todo.any():
                return {"inputs": levels.view(n, s * s) + 1, "targets": labels, "marks": marks}
        raise ArgumentError(f"Pathfinder: no image with separate curves in 1000 draws; fewer or shorter curves "
                            f"(path_length {self.path_length}, distractors {self.distractors}) for side {s}")

    def describe(self) -> str:
        return (f"pathfinder: {self.side}x{self.side} images as {self.length} pixel tokens, two curves of "
                f"{self.path_length} steps and {self.distractors} distractors, are the marks joined "
                f"(classify, 2 classes)")
