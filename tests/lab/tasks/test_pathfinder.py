"""pathfinder: curves, two marks, and the label as 8-connectivity of the marks (checked by an independent search)."""

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab import tasks
from tests.lab.tasks import long_task_contract as contract


def test_seeds():
    contract.check_seeds("pathfinder", side=16)


@pytest.mark.parametrize("sizes", [{}, {"side": 16}, {"length": 576, "distractors": 0}])
def test_layout(sizes):
    task, batch = contract.check_layout("pathfinder", **sizes)
    assert task.vocab_size == 4 and task.length == task.side ** 2
    assert ((batch["inputs"] == 3).sum(1) == 2).all()  # two marks, at the recorded places
    marks = batch["marks"]
    flat = marks[..., 0] * task.side + marks[..., 1]
    assert (batch["inputs"].gather(1, flat) == 3).all()


@pytest.mark.parametrize("sizes", [{"side": 16}, {"side": 32}, {"side": 24, "turn": 0.0, "distractors": 8}])
def test_exact_balance_and_exact_solver(sizes):
    contract.check_balance("pathfinder", n=101, tolerance=0.5 / 101 + 1e-9, **sizes)
    contract.check_solver("pathfinder", **sizes)


def test_curves_are_long_and_marks_apart():
    task, batch = contract.sample("pathfinder", n=50, side=32)
    drawn = (batch["inputs"] >= 2).sum(1)
    assert (drawn >= 2 * task.side // 2).all()  # two curves of 40 steps cover at least ~32 pixels
    gap = (batch["marks"][:, 0] - batch["marks"][:, 1]).abs().amax(1)
    assert (gap >= 2).all() and gap.double().mean() > 6


def test_walks_stay_inside_move_to_neighbours_and_go_straight_without_turns():
    def straight_share(turn):
        task = tasks.get("pathfinder", side=64, path_length=8, turn=turn)
        walks = task._walks(400, torch.Generator().manual_seed(0))  # (n, curves, 9, 2)
        steps = walks.diff(dim=2)
        assert walks.min() >= 0 and walks.max() < 64 and steps.abs().max() <= 1
        return (steps == steps[:, :, :1]).all(3).all(2).double().mean().item()

    assert straight_share(0.0) > 0.6 and straight_share(0.25) < 0.1  # straight unless an edge was met


def test_shortcuts_stay_at_chance():
    contract.check_shortcuts("pathfinder", side=16, window=32)


@pytest.mark.slow
def test_shortcuts_stay_at_chance_at_full_size():
    contract.check_shortcuts("pathfinder", train=2000, test=1000)


@pytest.mark.parametrize(("sizes", "arg"), [
    ({"side": 7}, "side"), ({"length": 1000}, "length"), ({"path_length": 1}, "path_length"),
    ({"distractors": -1}, "distractors"), ({"distractor_length": 0}, "distractor_length"),
    ({"distractor_length": 50, "path_length": 40}, "distractor_length"), ({"turn": 0.6}, "turn"),
])
def test_bad_sizes(sizes, arg):
    with pytest.raises(ArgumentError, match=rf"\b{arg} must"):
        tasks.get("pathfinder", **sizes)
