"""associative_recall: facts in the first 3/8, queries in the last 3/8; a query's label is its key's value."""

import pytest
import torch

from attnkit.errors import ArgumentError
from tests.lab.tasks import long_task_contract as contract

SMALL = {"length": 256, "repeats": 4, "queries": 4}


def test_seeds():
    contract.check_seeds("associative_recall", **SMALL)


ODD = {"length": 200, "num_keys": 6, "num_values": 3, "repeats": 4, "queries": 2, "filler": 1}


@pytest.mark.parametrize("sizes", [{}, SMALL, ODD])
def test_layout(sizes):
    task, _ = contract.check_layout("associative_recall", **sizes)
    assert task.vocab_size == 1 + task.filler + task.num_keys * (1 + task.num_values)


@pytest.mark.parametrize("sizes", [SMALL, {"length": 300, "num_keys": 9, "num_values": 3, "repeats": 3}])
def test_balance_and_exact_solver(sizes):
    contract.check_balance("associative_recall", **sizes)
    contract.check_solver("associative_recall", **sizes)


def test_facts_come_first_queries_last_and_each_value_is_held_equally():
    _, batch = contract.sample("associative_recall", n=20, length=512, num_keys=6, num_values=3, repeats=5,
                               queries=3, filler=2)
    region, first_key, first_fact = 3 * 512 // 8, 1 + 2, 1 + 2 + 6
    for row, target, values in zip(batch["inputs"], batch["targets"], batch["values"], strict=True):
        facts = (row >= first_fact).nonzero().view(-1)
        queries = ((row >= first_key) & (row < first_fact)).nonzero().view(-1)
        assert len(facts) == 6 * 5 and len(queries) == 6 * 3
        assert facts.max() < region and queries.min() >= 512 - region  # at least 512 / 4 apart
        assert torch.equal((target != -100).nonzero().view(-1), queries)
        for pos in facts.tolist():
            key, value = divmod(int(row[pos]) - first_fact, 3)
            assert values[key] == value  # every statement of a fact gives its key's value
        for pos in queries.tolist():
            assert target[pos] == values[int(row[pos]) - first_key]
        assert torch.bincount(values, minlength=3).tolist() == [2, 2, 2]
        assert set(row[:region][(row[:region] < first_key)].tolist()) <= {1, 2}  # filler between the facts


def test_shortcuts_stay_at_chance():
    contract.check_shortcuts("associative_recall", train=300, test=200, **SMALL)


@pytest.mark.slow
def test_shortcuts_stay_at_chance_at_full_length():
    contract.check_shortcuts("associative_recall", train=1500, test=600)


@pytest.mark.parametrize(("sizes", "arg"), [
    ({"num_values": 1}, "num_values"), ({"num_keys": 6, "num_values": 4}, "num_keys"), ({"repeats": 0}, "repeats"),
    ({"queries": 0}, "queries"), ({"filler": 0}, "filler"), ({"length": 64, "repeats": 10}, "length"),
])
def test_bad_sizes(sizes, arg):
    with pytest.raises(ArgumentError, match=rf"\b{arg} must"):
        contract.sample("associative_recall", **sizes)


def test_the_question_positions_read_from_the_inputs_are_the_labelled_positions():
    from attnkit.lab import tasks

    task = tasks.get("associative_recall", length=128, num_keys=4, repeats=4, queries=4)
    batch = task.sample(16, torch.Generator().manual_seed(5))
    asked = task.question_positions(batch["inputs"])
    assert asked.dtype == torch.bool and asked.shape == batch["inputs"].shape
    assert torch.equal(asked, batch["targets"] != -100)  # exactly where an answer is scored, no target read
