"""Shapes images drawn as specified; digits via a stand-in scikit-learn module."""

import importlib.util
import sys
import types

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab import tasks
from attnkit.lab.tasks import digits


def test_noise_free_shapes_match_their_label():
    task = tasks.get("shapes", size=13, min_size=1, max_size=4, noise=0.0)
    batch = task.sample(200, generator=torch.Generator().manual_seed(0))
    assert batch["images"].shape == (200, 1, 13, 13) and batch["images"] is batch["inputs"]
    assert set(batch["labels"].tolist()) == {0, 1, 2, 3}
    for image, label in zip(batch["images"][:, 0], batch["labels"].tolist(), strict=True):
        ys, xs = (image > 0).nonzero(as_tuple=True)
        values = image[image > 0]
        assert torch.allclose(values, values[0].expand_as(values)) and 0.6 <= values[0] <= 1.0
        h, w = int(ys.max() - ys.min()) + 1, int(xs.max() - xs.min()) + 1
        if label == 0:
            assert h == 1 and w == len(xs) and 3 <= w <= 9
        elif label == 1:
            assert w == 1 and h == len(ys) and 3 <= h <= 9
        elif label == 2:
            assert h == w and len(xs) == 4 * (h - 1)  # a ring of side h
        else:
            dy, dx = ys - ys.min(), xs - xs.min()
            assert h == w and len(xs) == 2 * h - 1 and ((dy == dx) | (dy + dx == h - 1)).all()


def test_noise_is_added():
    task = tasks.get("shapes", noise=0.2)
    images = task.sample(50, generator=torch.Generator().manual_seed(0))["images"]
    assert 0.15 < images[images.abs() < 0.5].std() < 0.25


def test_digits_from_a_stand_in_sklearn(monkeypatch):
    fake = types.ModuleType("sklearn.datasets")
    fake.load_digits = lambda: types.SimpleNamespace(images=torch.arange(20 * 64).reshape(20, 8, 8) % 17,
                                                      target=torch.arange(20) % 10)
    monkeypatch.setitem(sys.modules, "sklearn", types.ModuleType("sklearn"))
    monkeypatch.setitem(sys.modules, "sklearn.datasets", fake)
    monkeypatch.setattr(digits, "available", lambda: True)
    digits._load.cache_clear()
    try:
        train, test = digits.Digits(), digits.Digits("test")
        a = train.sample(30, generator=torch.Generator().manual_seed(0))
        b = test.sample(30, generator=torch.Generator().manual_seed(0))
    finally:
        digits._load.cache_clear()
    assert a["images"].shape == (30, 1, 8, 8) and a["images"].max() <= 1.0
    first = (a["images"][:, 0, 0, 0] * 16).round().long()  # the stand-in's pixel [0, 0] is 64 i % 17
    index = [next(i for i in range(20) if (64 * i) % 17 == f) for f in first.tolist()]
    assert max(index) < 16 and all(a["labels"][k] == i % 10 for k, i in enumerate(index))
    assert set(b["labels"].tolist()) <= {6, 7, 8, 9}  # the test split is images 16..19
    assert train.accuracy(a["labels"], a) == 1.0


def test_digits_needs_sklearn_or_a_valid_split(monkeypatch):
    monkeypatch.setattr(digits, "available", lambda: False)
    with pytest.raises(ArgumentError, match="scikit-learn"):
        digits.Digits()
    with pytest.raises(ArgumentError, match="split"):
        digits.Digits("val")
    assert ("digits" in tasks.names()) == (importlib.util.find_spec("sklearn") is not None)
