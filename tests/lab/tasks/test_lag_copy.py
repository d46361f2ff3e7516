"""Lag copy: the exact solver scores 100 %, a uniform guess scores chance, scoring from a position, bad sizes."""

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab import tasks
from attnkit.lab.tasks import IGNORE_INDEX
from attnkit.lab.tasks.lag_copy import solve


def _batch(n=64, seed=0, **sizes):
    task = tasks.get("lag_copy", **sizes)
    return task, task.sample(n, generator=torch.Generator().manual_seed(seed))


def test_targets_are_the_token_lag_back_checked_by_plain_python():
    task, batch = _batch(seq_len=10, vocab=5, lag=3)
    for row, labels in zip(batch["inputs"].tolist(), batch["targets"].tolist(), strict=True):
        assert labels == [IGNORE_INDEX] * 3 + row[:7]
    assert task.vocab_size == task.num_classes == 5


def test_the_exact_solver_scores_100_percent_and_a_uniform_guess_scores_chance():
    task, batch = _batch(n=2000, seq_len=24, vocab=8, lag=1)
    assert task.accuracy(solve(batch["inputs"], task.lag).clamp(min=0), batch) == 1.0
    guess = torch.randint(0, task.vocab, batch["targets"].shape, generator=torch.Generator().manual_seed(1))
    assert abs(task.accuracy(guess, batch) - task.chance) < 0.01
    assert task.chance == 1 / 8


def test_scored_from_leaves_the_training_length_unscored():
    _, batch = _batch(seq_len=16, vocab=4, lag=1, scored_from=8)
    assert (batch["targets"][:, :8] == IGNORE_INDEX).all()
    assert torch.equal(batch["targets"][:, 8:], batch["inputs"][:, 7:15])


@pytest.mark.parametrize("sizes", [{"lag": 0}, {"vocab": 1}, {"seq_len": 4, "lag": 4},
                                   {"seq_len": 4, "scored_from": 4}])
def test_bad_sizes_are_refused(sizes):
    with pytest.raises(ArgumentError):
        tasks.get("lag_copy", **sizes)
