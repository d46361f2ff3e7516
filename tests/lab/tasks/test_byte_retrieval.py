"""byte_retrieval: two documents around one separator, topics marked by '#', identical token counts."""

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab.tasks.byte_retrieval import SEPARATOR
from tests.lab.tasks import long_task_contract as contract


def test_seeds():
    contract.check_seeds("byte_retrieval", length=256)


@pytest.mark.parametrize("sizes", [{}, {"length": 256}, {"length": 62, "topic_size": 2}])
def test_layout_and_one_separator_in_the_middle(sizes):
    task, batch = contract.check_layout("byte_retrieval", **sizes)
    x = batch["inputs"]
    assert task.vocab_size == 258 and SEPARATOR == 257
    assert ((x == SEPARATOR).nonzero()[:, 1] == task.length // 2 - 1).all() and (x == SEPARATOR).sum() == len(x)


@pytest.mark.parametrize("sizes", [{"length": 256}, {"length": 512, "topic_size": 1}])
def test_balance_and_exact_solver(sizes):
    contract.check_balance("byte_retrieval", **sizes)
    contract.check_solver("byte_retrieval", **sizes)


def test_every_input_has_the_same_token_counts():
    _, batch = contract.sample("byte_retrieval", n=100, length=300)
    counts = torch.stack([torch.bincount(row, minlength=258) for row in batch["inputs"]])
    assert (counts == counts[0]).all()


def test_topics_are_marked_once_each_and_match_the_label():
    task, batch = contract.sample("byte_retrieval", n=60, length=256, topic_size=3)
    for row, label, topics in zip(batch["inputs"], batch["targets"].tolist(), batch["topics"], strict=True):
        first, second = task.decode(row).split("|")
        marked = [[doc[i + 1] for i in range(len(doc)) if doc[i] == "#"] for doc in (first, second)]
        assert marked == [[chr(c - 1) for c in t.tolist()] for t in topics]
        assert all(len(set(m)) == 3 for m in marked) and (set(marked[0]) == set(marked[1])) == bool(label)


def test_shortcuts_stay_at_chance():
    contract.check_shortcuts("byte_retrieval", length=256)


@pytest.mark.slow
def test_shortcuts_stay_at_chance_at_full_length():
    contract.check_shortcuts("byte_retrieval", train=2000, test=1000)


@pytest.mark.parametrize(("sizes", "arg"), [
    ({"length": 61, "topic_size": 2}, "length"), ({"topic_size": 0}, "topic_size"), ({"topic_size": 14}, "topic_size"),
])
def test_bad_sizes(sizes, arg):
    with pytest.raises(ArgumentError, match=rf"\b{arg} must"):
        contract.sample("byte_retrieval", **sizes)
