"""State-tracking tasks: targets against a plain-Python running product, scoring from a position, bad sizes."""

import itertools

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab import tasks
from attnkit.lab.tasks import IGNORE_INDEX
from attnkit.lab.tasks.state_tracking import composition_table, permutations


def _batch(name, n=16, seed=0, **sizes):
    task = tasks.get(name, **sizes)
    return task, task.sample(n, generator=torch.Generator().manual_seed(seed))


def test_modular_count_targets_are_the_ones_so_far_modulo_m():
    _, batch = _batch("modular_count", seq_len=30, modulus=5)
    for bits, labels in zip(batch["inputs"].tolist(), batch["targets"].tolist(), strict=True):
        assert set(bits) <= {0, 1}
        assert labels == [sum(bits[:t + 1]) % 5 for t in range(30)]


def test_parity_is_counting_modulo_two_and_refuses_another_modulus():
    task, batch = _batch("parity", seq_len=12)
    assert task.num_classes == 2 and task.vocab_size == 2
    assert torch.equal(batch["targets"], batch["inputs"].cumsum(1) % 2)
    with pytest.raises(ArgumentError, match="modulus"):
        tasks.get("parity", modulus=3)


def test_groups_have_their_orders_and_the_identity_first():
    assert [len(permutations(g)) for g in ("S3", "S5", "A5")] == [6, 120, 60]
    for group in ("S3", "A5"):
        perms = permutations(group)
        assert perms[0] == tuple(range(len(perms[0])))
        table = composition_table(group)
        assert (table[0] == torch.arange(len(perms))).all()  # identity o b = b
        for row in table.tolist():  # a Latin square: every product appears once per row
            assert sorted(row) == list(range(len(perms)))


def test_a5_is_closed_under_composition_and_holds_only_even_permutations():
    perms = set(permutations("A5"))
    for a, b in itertools.islice(itertools.product(perms, perms), 500):
        assert tuple(a[b[i]] for i in range(5)) in perms
    assert (4, 3, 2, 1, 0) in perms and (1, 0, 2, 3, 4) not in perms  # two swaps even, one swap odd


@pytest.mark.parametrize("group", ["S3", "S5", "A5"])
def test_word_problem_targets_are_the_running_composition(group):
    _, batch = _batch("word_problem", seq_len=10, group=group)
    perms = permutations(group)
    for ids, labels in zip(batch["inputs"].tolist(), batch["targets"].tolist(), strict=True):
        state = perms[ids[0]]
        expected = [ids[0]]
        for i in ids[1:]:
            state = tuple(perms[i][state[j]] for j in range(len(state)))  # x_t o p_{t-1}
            expected.append(perms.index(state))
        assert labels == expected


def test_scored_from_leaves_the_first_positions_unscored_and_keeps_the_rest():
    task, batch = _batch("word_problem", seq_len=20, group="S3", scored_from=8)
    _, whole = _batch("word_problem", seq_len=20, group="S3")
    assert (batch["targets"][:, :8] == IGNORE_INDEX).all()
    assert torch.equal(batch["targets"][:, 8:], whole["targets"][:, 8:])  # same seed, same sequences
    assert task.accuracy(whole["targets"], batch) == 1.0


def test_same_seed_same_batch():
    a = _batch("modular_count", seed=3)[1]
    b = _batch("modular_count", seed=3)[1]
    assert torch.equal(a["inputs"], b["inputs"]) and torch.equal(a["targets"], b["targets"])


@pytest.mark.parametrize(("name", "sizes", "field"), [
    ("modular_count", {"modulus": 1}, "modulus"), ("modular_count", {"seq_len": 0}, "seq_len"),
    ("parity", {"seq_len": 5, "scored_from": 5}, "scored_from"), ("word_problem", {"group": "S4"}, "group"),
    ("word_problem", {"scored_from": -1}, "scored_from")])
def test_bad_sizes_are_named(name, sizes, field):
    with pytest.raises(ArgumentError, match=field):
        tasks.get(name, **sizes)


def test_the_named_word_problems_are_their_groups_and_refuse_another():
    assert tasks.get("word_problem_s3") == tasks.get("word_problem_s3", group="S3")
    assert tasks.get("word_problem_a5").vocab_size == 60
    with pytest.raises(ArgumentError, match="group"):
        tasks.get("word_problem_a5", group="S5")
