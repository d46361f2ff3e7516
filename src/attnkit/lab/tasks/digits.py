"""Handwritten 8x8 digits from scikit-learn's bundled copy (optional: only when sklearn is installed)."""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from typing import ClassVar

import torch

from ...errors import ArgumentError
from .base import Task, register

__all__ = ["Digits", "available"]


def available() -> bool:
    """True when scikit-learn can be imported (the task is registered only then)."""
    return importlib.util.find_spec("sklearn") is not None


@lru_cache(maxsize=1)
def _load() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits  # optional dependency, read from the installed package

    data = load_digits()
    images = torch.as_tensor(data.images, dtype=torch.float32) / 16.0  # (1797, 8, 8) in [0, 1]
    return images.unsqueeze(1), torch.as_tensor(data.target, dtype=torch.long)


class Digits(Task):
    """Classify 8x8 grayscale handwritten digits (scikit-learn's copy of the UCI optdigits test set).

    Alpaydin & Kaynak 1998, "Optical Recognition of Handwritten Digits", UCI Machine Learning
    Repository (1797 images, shipped inside scikit-learn, so nothing is downloaded). A fixed
    split: the first 80 % (1437 images) is ``"train"``, the rest ``"test"``; ``sample`` draws
    uniformly with replacement from the split. Pixels are scaled from 0..16 to [0, 1].

    Differences from the paper: none (a real data set, used as is).

    Shapes:
        ``inputs`` = ``images (n, 1, 8, 8)`` float32, ``targets`` = ``labels (n,)`` in 0..9.

    Complexity: ``O(n)`` per batch after a one-time load.

    Args:
        split: ``"train"`` or ``"test"``.

    Example:
        >>> import torch
        >>> from attnkit.lab.tasks import Digits
        >>> task = Digits("train")  # doctest: +SKIP
        >>> task.sample(4, generator=torch.Generator().manual_seed(0))["images"].shape  # doctest: +SKIP
        torch.Size([4, 1, 8, 8])
    """

    name: ClassVar[str] = "digits"
    kind: ClassVar[str] = "image"

    def __init__(self, split: str = "train"):
        if split not in ("train", "test"):
            raise ArgumentError(f"Digits: split must be 'train' or 'test'; got {split!r}")
        if not available():
            raise ArgumentError("Digits: needs scikit-learn (pip install scikit-learn); it is not installed")
        self.split = split

    def __repr__(self) -> str:
        return f"Digits(split={self.split!r})"

    @property
    def num_classes(self) -> int:
        return 10

    def _sample(self, n, generator):
        images, labels = _load()
        cut = int(0.8 * len(labels))
        lo, hi = (0, cut) if self.split == "train" else (cut, len(labels))
        index = torch.randint(lo, hi, (n,), generator=generator)
        x, y = images[index], labels[index]
        return {"inputs": x, "images": x, "targets": y, "labels": y}

    def describe(self) -> str:
        return f"digits: 8x8 handwritten digits from scikit-learn, {self.split} split (image, 10 classes)"


if available():
    register(Digits)
