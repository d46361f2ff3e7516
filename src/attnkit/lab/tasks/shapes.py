"""Small generated images of four shapes (for vision transformers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import check_int
from .base import Task, check_float, register

__all__ = ["Shapes", "SHAPE_NAMES"]

SHAPE_NAMES = ("horizontal bar", "vertical bar", "square outline", "diagonal cross")


@register
@dataclass(frozen=True)
class Shapes(Task):
    """Classify which of four shapes is drawn in a small noisy grayscale image.

    For Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words: Transformers for Image
    Recognition at Scale", ICLR, arXiv:2010.11929 (patches as tokens); the images are
    generated. Label ``c`` draws ``SHAPE_NAMES[c]`` around a random centre ``(cy, cx)`` with a
    random half-size ``r`` in ``[min_size, max_size]`` (pixel offsets ``dy, dx`` from the centre):

    - 0 horizontal bar: ``dy == 0`` and ``|dx| <= r``;   1 vertical bar: ``dx == 0`` and ``|dy| <= r``
    - 2 square outline: ``max(|dy|, |dx|) == r``;       3 diagonal cross: ``|dy| == |dx| <= r``

    The whole shape lies inside the image. Pixels are ``intensity`` (uniform in [0.6, 1]) on
    the shape, 0 elsewhere, plus Gaussian noise of standard deviation ``noise``.

    Differences from the paper: generated images stand in for ImageNet.

    Shapes:
        ``inputs`` = ``images (n, 1, size, size)`` float32, ``targets`` = ``labels (n,)`` in 0..3.

    Complexity: ``O(n size^2)`` per batch, vectorised.

    Args:
        size: image side in pixels.
        min_size, max_size: half-size range of a shape (``2 max_size + 1 <= size``).
        noise: standard deviation of the added Gaussian noise.

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("shapes", noise=0.0)
        >>> batch = task.sample(4, generator=torch.Generator().manual_seed(0))
        >>> batch["images"].shape, batch["labels"].dtype, bool((batch["images"] >= 0).all())
        (torch.Size([4, 1, 16, 16]), torch.int64, True)
    """

    name: ClassVar[str] = "shapes"
    kind: ClassVar[str] = "image"

    size: int = 16
    min_size: int = 2
    max_size: int = 5
    noise: float = 0.1

    def __post_init__(self):
        check_int("Shapes", "size", self.size, 3)
        check_int("Shapes", "min_size", self.min_size, 1)
        check_int("Shapes", "max_size", self.max_size, self.min_size, " (= min_size)")
        check_int("Shapes", "size", self.size, 2 * self.max_size + 1, " (= 2 max_size + 1)")
        check_float("Shapes", "noise", self.noise, 0.0, float("inf"), high_open=True)

    @property
    def num_classes(self) -> int:
        return len(SHAPE_NAMES)

    def _sample(self, n, generator):
        g, s = generator, self.size
        labels = torch.randint(0, 4, (n,), generator=g)
        r = torch.randint(self.min_size, self.max_size + 1, (n,), generator=g)
        # centre in [r, s - 1 - r]: the shape stays inside the image
        cy = r + (torch.rand(n, generator=g) * (s - 2 * r)).long().clamp_max(s - 1 - 2 * r)
        cx = r + (torch.rand(n, generator=g) * (s - 2 * r)).long().clamp_max(s - 1 - 2 * r)
        intensity = 0.6 + 0.4 * torch.rand(n, generator=g)
        grid = torch.arange(s)
        dy = (grid.view(1, s, 1) - cy.view(n, 1, 1)).abs()  # (n, s, 1)
        dx = (grid.view(1, 1, s) - cx.view(n, 1, 1)).abs()  # (n, 1, s)
        rr = r.view(n, 1, 1)
        drawn = torch.stack([
            (dy == 0) & (dx <= rr),
            (dx == 0) & (dy <= rr),
            torch.maximum(dy, dx) == rr,
            (dy == dx) & (dy <= rr),
        ], dim=1)  # (n, 4, s, s)
        shape = drawn[torch.arange(n), labels]  # (n, s, s)
        images = shape.float() * intensity.view(n, 1, 1) + self.noise * torch.randn(n, s, s, generator=g)
        images = images.unsqueeze(1)  # (n, 1, s, s)
        return {"inputs": images, "images": images, "targets": labels, "labels": labels}

    def describe(self) -> str:
        return (f"shapes: {self.size}x{self.size} grayscale images of {len(SHAPE_NAMES)} shapes, half-size "
                f"{self.min_size}-{self.max_size}, noise {self.noise:g} (image, 4 classes)")
