"""Pixel-sequence image classification: how many different shapes are in a small grayscale image."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Task, register
from .pixels import resolve_side

__all__ = ["PixelImages", "SHAPES"]

SHAPES = {  # name -> (height, width) of its box; every shape has 16 pixels
    "ring": (5, 5), "block": (4, 4), "wide bar": (2, 8), "tall bar": (8, 2),
}
_NUM_OBJECTS = 3
_BACKGROUND_MAX, _OBJECT_LOW, _OBJECT_HIGH, _OBJECT_JITTER = 95, 176, 239, 16


def _offsets() -> torch.Tensor:
    """``(4, 16, 2)``: the (row, column) of each shape's pixels from its box's top-left corner."""
    out = []
    for h, w in SHAPES.values():
        box = torch.ones(h, w, dtype=torch.bool)
        if (h, w) == (5, 5):
            box[1:-1, 1:-1] = False  # ring: the outline only
        out.append(box.nonzero())
    return torch.stack(out)


_OFFSETS = _offsets()
_BOXES = torch.tensor(list(SHAPES.values()))  # (4, 2)


@register
@dataclass(frozen=True)
class PixelImages(Task):
    """Count the distinct shapes among three objects in a ``side x side`` image read pixel by pixel.

    For Long Range Arena's pixel-level image classification (Tay et al. 2021, arXiv:2011.04006,
    Sec. 3.4: CIFAR-10 as a sequence of 1024 grayscale pixel tokens, no 2-D prior); the images are
    generated. Each image holds three non-touching objects (boxes at least one pixel apart), each
    one of four shapes of 16 pixels (``SHAPES``: 5x5 ring, 4x4 block, 2x8 and 8x2 bars), on a
    noisy background. Label ``c``: the image holds ``c + 1`` different shapes (0: all three alike,
    1: a pair and another, 2: all different); classes are balanced.

    Pixel levels (0..255): background uniform in ``0 .. 95``; an object has a level drawn in
    ``176 .. 239`` plus per-pixel noise in ``-16 .. 16``.

    What it tests: relating objects anywhere in the image from a flat pixel sequence. Why it needs
    long range: the objects are up to ``side^2`` tokens apart and no one object tells the label
    (each object's shape is uniform over the four in every class); token counts do not decide it:
    every image has 48 object pixels and the same level distributions whatever its class. A window
    of the last rows sees at most parts of objects.

    Token ids: pixel level ``p`` -> ``p + 1`` (``vocab_size`` 257; 0, padding, never occurs).

    Shapes:
        ``inputs (n, length)`` long, ``length = side^2`` (row-major: reshape to ``(n, side, side)``);
        ``targets (n,)`` in 0..2; ``shapes (n, 3)`` each object's shape index into ``SHAPES``;
        ``corners (n, 3, 2)`` each object's top-left (row, column).

    Complexity: ``O(n side^2)`` per batch, vectorised (a few redraws of overlapping placements).

    Args:
        length: tokens per image, a square (default ``side^2``).
        side: image side in pixels, >= 12 (give ``length`` or ``side``; default side 32).

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("pixel_images", side=16)
        >>> batch = task.sample(3, generator=torch.Generator().manual_seed(0))
        >>> batch["inputs"].shape, task.length, task.side
        (torch.Size([3, 256]), 256, 16)
        >>> bright = batch["inputs"].view(3, 16, 16) > 128  # ids are levels + 1
        >>> bright.sum((1, 2)).tolist()
        [48, 48, 48]
    """

    name: ClassVar[str] = "pixel_images"
    kind: ClassVar[str] = "classify"
    vocab_size: ClassVar[int] = 257

    length: int | None = None
    side: int | None = None

    def __post_init__(self):
        length, side = resolve_side("PixelImages", self.length, self.side, smallest=12)
        object.__setattr__(self, "length", length)
        object.__setattr__(self, "side", side)

    @property
    def num_classes(self) -> int:
        return _NUM_OBJECTS

    def _shapes(self, labels: torch.Tensor, g) -> torch.Tensor:
        """``(n, 3)`` shape indices holding ``labels + 1`` distinct shapes, in random order."""
        n = len(labels)
        pick = torch.rand(n, len(SHAPES), generator=g).argsort(1)  # distinct shapes, random
        first, second, third = pick[:, 0], pick[:, 1], pick[:, 2]
        shapes = torch.stack([first, torch.where(labels >= 1, second, first),
                              torch.where(labels == 2, third, first)], 1)
        return shapes.gather(1, torch.rand(n, _NUM_OBJECTS, generator=g).argsort(1))

    def _corners(self, shapes: torch.Tensor, g) -> torch.Tensor:
        """``(n, 3, 2)`` top-left corners inside the image, boxes at least one pixel apart (redrawn until so)."""
        n, s = len(shapes), self.side
        box = _BOXES[shapes]  # (n, 3, 2)
        corners = torch.zeros(n, _NUM_OBJECTS, 2, dtype=torch.long)
        todo = torch.ones(n, dtype=torch.bool)
        while todo.any():
            room = (s - box[todo] + 1).double()
            corners[todo] = (torch.rand(room.shape, generator=g, dtype=torch.float64) * room).long()
            low, high = corners, corners + box  # box i covers [low, high) on each axis
            apart = torch.ones(n, dtype=torch.bool)
            for i in range(_NUM_OBJECTS):
                for j in range(i + 1, _NUM_OBJECTS):
                    gap = (high[:, i] < low[:, j]) | (high[:, j] < low[:, i])  # (n, 2): a free pixel between
                    apart &= gap.any(1)
            todo &= ~apart
        return corners

    def _sample(self, n, generator):
        g, s = generator, self.side
        labels = (torch.arange(n) % _NUM_OBJECTS)[torch.randperm(n, generator=g)]
        shapes = self._shapes(labels, g)
        corners = self._corners(shapes, g)
        image = torch.randint(0, _BACKGROUND_MAX + 1, (n, s * s), generator=g)
        pixels = corners.unsqueeze(2) + _OFFSETS[shapes]  # (n, 3, 16, 2)
        flat = (pixels[..., 0] * s + pixels[..., 1]).view(n, -1)
        level = torch.randint(_OBJECT_LOW, _OBJECT_HIGH + 1, (n, _NUM_OBJECTS, 1), generator=g)
        jitter = torch.randint(-_OBJECT_JITTER, _OBJECT_JITTER + 1, (n, _NUM_OBJECTS, 16), generator=g)
        image.scatter_(1, flat, (level + jitter).view(n, -1))
        return {"inputs": image + 1, "targets": labels, "shapes": shapes, "corners": corners}

    def describe(self) -> str:
        return (f"pixel_images: {self.side}x{self.side} images as {self.length} pixel tokens, label = number of "
                f"different shapes among three (classify, 3 classes)")
