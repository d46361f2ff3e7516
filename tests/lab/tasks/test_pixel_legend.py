"""pixel_legend: a legend of (colour, class) entries on top, 4x4 objects below; an object pixel's label is its
colour's class."""

import pytest
import torch

from attnkit.errors import ArgumentError
from tests.lab.tasks import long_task_contract as contract

SMALL = {"side": 16, "objects": 3}


def test_seeds():
    contract.check_seeds("pixel_legend", **SMALL)


@pytest.mark.parametrize("sizes", [{}, SMALL, {"length": 400, "colours": 6, "classes": 3, "legend_rows": 2}])
def test_layout(sizes):
    task, _ = contract.check_layout("pixel_legend", **sizes)
    assert task.length == task.side ** 2 and task.vocab_size == 9 + task.colours * (1 + task.classes)


def test_balance_and_exact_solver():
    contract.check_balance("pixel_legend", n=600, **SMALL)
    contract.check_solver("pixel_legend", **SMALL)


def test_objects_sit_below_the_legend_and_take_their_colours_class():
    _, batch = contract.sample("pixel_legend", n=30, side=20, colours=6, classes=3, objects=4, legend_rows=2)
    for row, target, classes in zip(batch["inputs"], batch["targets"], batch["classes"], strict=True):
        image, labels = row.view(20, 20), target.view(20, 20)
        legend = image[:2].reshape(-1) - 9 - 6  # entries (colour, class) = colour * 3 + class
        assert (legend >= 0).all() and torch.equal(classes[legend // 3], legend % 3)
        assert set((legend // 3).tolist()) == set(range(6))  # every colour is in the legend
        objects = (image >= 9) & (image < 15)
        assert not objects[:2].any() and int(objects.sum()) == 4 * 16
        assert torch.equal(labels != -100, objects)
        assert torch.equal(labels[objects], classes[image[objects] - 9])
        assert ((image[~objects] >= 1) & (image[~objects] <= 8))[2 * 20:].all()  # background levels below


def test_shortcuts_stay_at_chance():
    contract.check_shortcuts("pixel_legend", train=300, test=200, **SMALL)


@pytest.mark.parametrize(("sizes", "arg"), [
    ({"classes": 1}, "classes"), ({"colours": 6, "classes": 4}, "colours"), ({"legend_rows": 0}, "legend_rows"),
    ({"side": 12, "objects": 5}, "objects"), ({"side": 7}, "side"),
])
def test_bad_sizes(sizes, arg):
    with pytest.raises(ArgumentError, match=rf"\b{arg} must"):
        contract.sample("pixel_legend", **sizes)


def test_the_question_positions_read_from_the_inputs_are_the_labelled_positions():
    from attnkit.lab import tasks

    task = tasks.get("pixel_legend", side=16, objects=3)
    batch = task.sample(16, torch.Generator().manual_seed(5))
    asked = task.question_positions(batch["inputs"])
    assert asked.dtype == torch.bool and asked.shape == batch["inputs"].shape
    assert torch.equal(asked, batch["targets"] != -100)  # exactly where an answer is scored, no target read
