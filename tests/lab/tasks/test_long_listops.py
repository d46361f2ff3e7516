"""Long ListOps: exact lengths, LRA's bounds on depth and arguments, labels from an independent evaluator."""

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab import tasks
from attnkit.lab.tasks.listops import OPERATORS, TOKENS
from attnkit.lab.tasks.long_checks import bag_of_tokens_accuracy, solve


def _batch(n=64, seed=0, **sizes):
    task = tasks.get("long_listops", **sizes)
    return task, task.sample(n, generator=torch.Generator().manual_seed(seed))


def test_same_seed_same_batch_other_seed_other_batch():
    _, a = _batch(seed=3, length=128)
    _, b = _batch(seed=3, length=128)
    _, c = _batch(seed=4, length=128)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["inputs"], c["inputs"])


@pytest.mark.parametrize("length", [256, 1024])
def test_layout_lengths_and_padding(length):
    task, batch = _batch(n=32, length=length)
    x, lengths, y = batch["inputs"], batch["lengths"], batch["targets"]
    assert x.shape == (32, length) and x.dtype == y.dtype == lengths.dtype == torch.int64 and y.shape == (32,)
    assert task.vocab_size == 16 and task.num_classes == 10 and x.max() < 16
    assert (lengths >= length // 2).all() and (lengths <= length).all()
    assert torch.equal((x != 0).sum(1), lengths)
    assert all((row[:n] != 0).all() and (row[n:] == 0).all() for row, n in zip(x, lengths.tolist(), strict=True))


@pytest.mark.parametrize("sizes", [{"length": 256}, {"length": 26, "max_depth": 3, "max_args": 4, "min_fraction": 1.0},
                                   {"length": 187, "max_depth": 4, "max_args": 5, "min_fraction": 0.9}])
def test_exact_solver_reads_the_label_off_every_input(sizes):
    task, batch = _batch(n=100, **sizes)
    assert task.accuracy(solve(task, batch), batch) == 1.0


def test_depth_and_arguments_stay_within_the_bounds():
    _, batch = _batch(n=40, length=300, max_depth=5, max_args=6)
    deepest_seen = 0
    for row in batch["inputs"].tolist():
        counts, depth = [], 0
        for t in (TOKENS[i] for i in row if i):
            if t in OPERATORS:
                if counts:
                    counts[-1] += 1
                counts.append(0)
                depth += 1
                deepest_seen = max(deepest_seen, depth)
            elif t == "]":
                assert 2 <= counts.pop() <= 6
                depth -= 1
            else:
                counts[-1] += 1
        assert depth == 0 and not counts
    assert deepest_seen == 4  # operators at depths 1 .. max_depth - 1, and the deepest is reached


def test_every_value_is_a_label_and_none_dominates():
    _, batch = _batch(n=600, length=128)
    share = torch.bincount(batch["targets"], minlength=10) / 600
    assert (share > 0.03).all() and (share < 0.3).all()


def test_token_counts_and_the_last_tokens_do_not_decide_the_label():
    task = tasks.get("long_listops", length=128)
    accuracy, chance = bag_of_tokens_accuracy(task, train=600, test=300)
    assert accuracy <= chance + 0.1
    accuracy, chance = bag_of_tokens_accuracy(task, window=32, train=600, test=300)
    assert accuracy <= chance + 0.1


@pytest.mark.slow
def test_token_counts_do_not_decide_the_label_at_full_length():
    task = tasks.get("long_listops")
    for window in (None, 64):
        accuracy, chance = bag_of_tokens_accuracy(task, window=window)
        assert accuracy <= chance + 0.1


@pytest.mark.parametrize(("sizes", "arg"), [
    ({"length": 3}, "length"), ({"length": 2000, "max_depth": 3}, "length"), ({"max_args": 3}, "max_args"),
    ({"max_depth": 1}, "max_depth"), ({"min_fraction": 0.0}, "min_fraction"), ({"min_fraction": 1.5}, "min_fraction"),
])
def test_bad_sizes_raise_argument_error_naming_them(sizes, arg):
    with pytest.raises(ArgumentError, match=rf"\b{arg} must"):
        tasks.get("long_listops", **sizes)
