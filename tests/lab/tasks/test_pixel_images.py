"""pixel_images: three 16-pixel objects apart on a darker background; the label counts distinct shapes."""

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab import tasks
from attnkit.lab.tasks.pixel_images import SHAPES
from tests.lab.tasks import long_task_contract as contract


def test_seeds():
    contract.check_seeds("pixel_images", side=16)


@pytest.mark.parametrize("sizes", [{}, {"side": 16}, {"length": 144}])
def test_layout(sizes):
    task, _ = contract.check_layout("pixel_images", **sizes)
    assert task.vocab_size == 257 and task.length == task.side ** 2


@pytest.mark.parametrize("sizes", [{"side": 16}, {"side": 32}])
def test_balance_and_exact_solver(sizes):
    contract.check_balance("pixel_images", **sizes)
    contract.check_solver("pixel_images", **sizes)


def test_objects_are_drawn_where_their_shapes_and_corners_say():
    _, batch = contract.sample("pixel_images", n=100, side=20)
    levels = batch["inputs"].view(100, 20, 20) - 1
    assert (levels >= 0).all() and (levels <= 255).all()
    boxes = list(SHAPES.values())
    for image, shapes, corners, label in zip(levels, batch["shapes"], batch["corners"], batch["targets"], strict=True):
        expected = torch.zeros(20, 20, dtype=torch.bool)
        for shape, (y, x) in zip(shapes.tolist(), corners.tolist(), strict=True):
            h, w = boxes[shape]
            expected[y:y + h, x:x + w] = True
            if (h, w) == (5, 5):
                expected[y + 1:y + 4, x + 1:x + 4] = False
        assert torch.equal(image >= 160, expected) and (image[~expected] <= 95).all()
        assert len(set(shapes.tolist())) == label + 1


def test_object_shapes_are_uniform_in_every_class():
    _, batch = contract.sample("pixel_images", n=1200, side=16)
    for label in range(3):
        shares = torch.bincount(batch["shapes"][batch["targets"] == label].view(-1), minlength=4).double()
        shares /= shares.sum()
        assert ((shares - 0.25).abs() < 0.06).all(), (label, shares.tolist())


def test_shortcuts_stay_at_chance():
    contract.check_shortcuts("pixel_images", side=16, window=32)


@pytest.mark.slow
def test_shortcuts_stay_at_chance_at_full_size():
    contract.check_shortcuts("pixel_images", train=2000, test=1000)


@pytest.mark.parametrize(("sizes", "arg"), [({"side": 11}, "side"), ({"length": 1000}, "length"),
                                            ({"length": 256, "side": 15}, "length")])
def test_bad_sizes(sizes, arg):
    with pytest.raises(ArgumentError, match=rf"\b{arg} must"):
        tasks.get("pixel_images", **sizes)
