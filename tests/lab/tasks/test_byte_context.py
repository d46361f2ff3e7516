"""byte_context: a header of '=' or '~', then marks '+'/'-'; a mark's stance is the mark read in the header's light."""

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab.tasks.byte_docs import encode
from tests.lab.tasks import long_task_contract as contract

SMALL = {"length": 256, "marks": 16}


def test_seeds():
    contract.check_seeds("byte_context", **SMALL)


@pytest.mark.parametrize("sizes", [{}, SMALL, {"length": 100, "marks": 5, "header_fraction": 4}])
def test_layout(sizes):
    task, _ = contract.check_layout("byte_context", **sizes)
    assert task.vocab_size == 257


def test_balance_and_exact_solver():
    contract.check_balance("byte_context", **SMALL)
    contract.check_solver("byte_context", **SMALL)


def test_the_header_decides_every_stance():
    task, batch = contract.sample("byte_context", n=40, length=320, marks=10, header_fraction=5)
    plus, minus = encode("+")[0], encode("-")[0]
    for row, target, negated in zip(batch["inputs"], batch["targets"], batch["negated"].tolist(), strict=True):
        text = task.decode(row)
        assert text[:64] == ("~" if negated else "=") * 64 and set(text[64:]) <= set("abcdefghijklmnopqrstuvwxyz +-")
        marks = ((row == plus) | (row == minus)).nonzero().view(-1)
        assert len(marks) == 10 and marks.min() >= 64
        assert ((target != -100).nonzero().view(-1) == marks).all()
        for pos in marks.tolist():
            assert target[pos] == int((row[pos] == plus).item() != negated)


def test_shortcuts_stay_at_chance():
    contract.check_shortcuts("byte_context", train=300, test=200, **SMALL)


@pytest.mark.parametrize(("sizes", "arg"), [
    ({"marks": 0}, "marks"), ({"header_fraction": 1}, "header_fraction"), ({"length": 3}, "length"),
    ({"length": 64, "marks": 60}, "marks"),
])
def test_bad_sizes(sizes, arg):
    with pytest.raises(ArgumentError, match=rf"\b{arg} must"):
        contract.sample("byte_context", **sizes)


def test_the_question_positions_read_from_the_inputs_are_the_labelled_positions():
    from attnkit.lab import tasks

    task = tasks.get("byte_context", length=256)
    batch = task.sample(16, torch.Generator().manual_seed(5))
    asked = task.question_positions(batch["inputs"])
    assert asked.dtype == torch.bool and asked.shape == batch["inputs"].shape
    assert torch.equal(asked, batch["targets"] != -100)  # exactly where an answer is scored, no target read
