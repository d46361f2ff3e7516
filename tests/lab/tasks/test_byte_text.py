"""byte_text: the question, the facts and their places; the label is the asked key's value."""

import re

import pytest
import torch

from attnkit.errors import ArgumentError
from tests.lab.tasks import long_task_contract as contract


def test_seeds():
    contract.check_seeds("byte_text", length=256)


@pytest.mark.parametrize("sizes", [{}, {"length": 256}, {"length": 43, "num_facts": 8}])
def test_layout(sizes):
    task, _ = contract.check_layout("byte_text", **sizes)
    assert task.vocab_size == 257


@pytest.mark.parametrize("sizes", [{"length": 256}, {"length": 300, "num_facts": 9, "num_classes": 3}])
def test_balance_and_exact_solver(sizes):
    contract.check_balance("byte_text", **sizes)
    contract.check_solver("byte_text", **sizes)


def test_question_first_then_one_fact_per_key_far_from_it():
    task, batch = contract.sample("byte_text", n=50, length=512, num_facts=6, num_classes=3)
    for row, label, q, f in zip(batch["inputs"], batch["targets"].tolist(), batch["question_position"].tolist(),
                                batch["fact_position"].tolist(), strict=True):
        text = task.decode(row)
        assert len(text) == 512 and set(text) <= set("abcdefghijklmnopqrstuvwxyz ?=ABCDEF012")
        assert re.fullmatch(r"[a-z ]*\?[A-F] [a-z ]*", text[:64 + 3]) and text.index("?") == q < 64
        facts = re.findall(r"([A-F])=(\d) ", text)
        assert sorted(k for k, _ in facts) == list("ABCDEF") and [text.index(k + "=") for k, _ in facts]
        assert sorted(v for _, v in facts) == list("001122")  # each value held num_facts / num_classes times
        asked = text[q + 1]
        assert f == text.index(asked + "=") >= 128 and int(text[f + 2]) == label


def test_shortcuts_stay_at_chance():
    contract.check_shortcuts("byte_text", length=256)


@pytest.mark.slow
def test_shortcuts_stay_at_chance_at_full_length():
    contract.check_shortcuts("byte_text", train=2000, test=1000)


@pytest.mark.parametrize(("sizes", "arg"), [
    ({"length": 42, "num_facts": 8}, "length"), ({"num_facts": 3}, "num_facts"), ({"num_facts": 28}, "num_facts"),
    ({"num_classes": 11, "num_facts": 22}, "num_classes"), ({"num_classes": 1}, "num_classes"),
])
def test_bad_sizes(sizes, arg):
    with pytest.raises(ArgumentError, match=rf"\b{arg} must"):
        contract.sample("byte_text", **sizes)


def test_bytes_decode_back():
    task, batch = contract.sample("byte_text", n=2, length=64, num_facts=4)
    text = task.decode(batch["inputs"][1])
    assert torch.equal(torch.tensor([b + 1 for b in text.encode()]), batch["inputs"][1])
