"""A pixel image with a legend: label every pixel of every object with the class its colour has in the legend."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import ArgumentError, check_int
from .base import IGNORE_INDEX, Task, register
from .pixels import resolve_side

__all__ = ["PixelLegend", "OBJECT", "GAP", "BACKGROUND_LEVELS"]

OBJECT, GAP = 4, 1  # objects are OBJECT x OBJECT squares on a grid of cells with GAP free pixels around
BACKGROUND_LEVELS = 8


@register
@dataclass(frozen=True)
class PixelLegend(Task):
    """Segment the objects of a ``side x side`` image, read pixel by pixel, by the classes a legend gives.

    For Long Range Arena's pixel-level image classification (Tay et al. 2021, arXiv:2011.04006,
    Sec. 3.4: an image as a flat sequence of pixel tokens, no 2-D prior); the images are generated,
    like a map and its legend. The top ``legend_rows`` rows are the legend: entries ``(colour,
    class)``, each of the ``colours`` entries repeated to fill the rows, in random order. Below it,
    ``objects`` squares of ``4 x 4`` pixels, each of one colour, sit on a grid of cells (one free
    pixel around each) on a noisy background. The target at an object pixel is the class of its
    colour in the legend; -100 elsewhere. Each class is held by ``colours / classes`` colours.

    What it tests: relating a pixel to a region of the image it is far from, by content (dense
    segmentation from a legend). Why it needs long range: an object is up to ``side^2`` tokens after
    the legend, and its colour alone says nothing (the legend is drawn afresh for every image).
    Token counts do not decide it: they show the legend's entries and the objects' colours, not
    which entry an object's colour picks; the last rows miss the legend.

    Token ids: 0 = padding (unused), background levels ``1 .. 8``, colour ``c`` = ``9 + c``, legend
    entry ``(c, l)`` = ``9 + colours + c classes + l``.

    Shapes:
        ``inputs (n, length)`` long, ``length = side^2`` row-major; ``targets (n, length)`` long;
        ``classes (n, colours)`` each colour's class.

    Complexity: ``O(n side^2)`` per batch, vectorised.

    Args:
        length: tokens per image, a square (default ``side^2``).
        side: image side (>= 8; give ``length`` or ``side``; default 24).
        colours: colours (a multiple of ``classes``).
        classes: classes (>= 2).
        objects: objects per image (they must fit on the grid below the legend).
        legend_rows: rows of the legend (>= 1).

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("pixel_legend", side=16, objects=3)
        >>> batch = task.sample(2, generator=torch.Generator().manual_seed(0))
        >>> batch["inputs"].shape, batch["targets"].ne(-100).sum(1).tolist()
        (torch.Size([2, 256]), [48, 48])
    """

    name: ClassVar[str] = "pixel_legend"
    kind: ClassVar[str] = "tokens"

    length: int | None = None
    side: int | None = None
    colours: int = 8
    classes: int = 4
    objects: int = 6
    legend_rows: int = 3

    def __post_init__(self):
        length, side = resolve_side("PixelLegend", self.length, self.side, default=24, smallest=8)
        object.__setattr__(self, "length", length)
        object.__setattr__(self, "side", side)
        check_int("PixelLegend", "classes", self.classes, 2)
        check_int("PixelLegend", "colours", self.colours, self.classes)
        if self.colours % self.classes:
            raise ArgumentError(f"PixelLegend: colours must be a multiple of classes = {self.classes}; "
                                f"got {self.colours}")
        check_int("PixelLegend", "legend_rows", self.legend_rows, 1)
        check_int("PixelLegend", "objects", self.objects, 1)
        if self.objects > self.cells[0] * self.cells[1]:
            raise ArgumentError(f"PixelLegend: objects must fit the {self.cells[0]} x {self.cells[1]} grid below "
                                f"the legend (<= {self.cells[0] * self.cells[1]}); got {self.objects}")

    @property
    def cells(self) -> tuple[int, int]:
        """Rows and columns of the grid of object cells below the legend."""
        step = OBJECT + GAP
        return (self.side - self.legend_rows) // step, self.side // step

    @property
    def vocab_size(self) -> int:
        return 1 + BACKGROUND_LEVELS + self.colours + self.colours * self.classes

    @property
    def num_classes(self) -> int:
        return self.classes

    def question_positions(self, inputs: torch.Tensor) -> torch.Tensor:
        """The object pixels: every colour token (ids ``9 .. 8 + colours``; the legend and the background use
        others), each asking which class the legend gives its colour."""
        first = 1 + BACKGROUND_LEVELS
        return (inputs >= first) & (inputs < first + self.colours)

    def _sample(self, n, generator):
        g, s, c = generator, self.side, self.colours
        rows = torch.arange(n).view(n, 1)
        image = 1 + torch.randint(0, BACKGROUND_LEVELS, (n, s * s), generator=g)
        classes = (torch.arange(c) % self.classes)[torch.rand(n, c, generator=g).argsort(1)]  # (n, colours)
        entries = 1 + BACKGROUND_LEVELS + c + torch.arange(c) * self.classes + classes  # (n, colours) legend ids
        legend = self.legend_rows * s
        image[:, :legend] = entries.gather(1, torch.rand(n, legend, generator=g).argsort(1) % c)
        grid_rows, grid_cols = self.cells
        cell = torch.rand(n, grid_rows * grid_cols, generator=g).argsort(1)[:, :self.objects]  # (n, objects)
        top = self.legend_rows + (cell // grid_cols) * (OBJECT + GAP)
        left = (cell % grid_cols) * (OBJECT + GAP)
        offsets = torch.arange(OBJECT).view(OBJECT, 1) * s + torch.arange(OBJECT)  # (4, 4) within a square
        pixels = ((top * s + left).view(n, -1, 1) + offsets.view(1, 1, -1)).view(n, -1)  # (n, objects * 16)
        colour = torch.randint(0, c, (n, self.objects), generator=g).repeat_interleave(OBJECT * OBJECT, 1)
        image[rows, pixels] = 1 + BACKGROUND_LEVELS + colour
        targets = torch.full((n, s * s), IGNORE_INDEX, dtype=torch.long)
        targets[rows, pixels] = classes.gather(1, colour)
        return {"inputs": image, "targets": targets, "classes": classes}

    def describe(self) -> str:
        return (f"pixel_legend: {self.side}x{self.side} images as {self.length} tokens, {self.objects} objects "
                f"labelled by a {self.legend_rows}-row legend of {self.colours} colours (tokens, "
                f"{self.classes} classes)")
