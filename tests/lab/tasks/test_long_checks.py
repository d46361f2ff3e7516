"""The ceiling checks themselves: counts per window, and a bag-of-tokens classifier that does learn counts."""

from dataclasses import dataclass

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab import tasks
from attnkit.lab.tasks.long_checks import bag_of_tokens_accuracy, solve, token_counts


def test_token_counts_skip_padding_and_keep_the_last_window():
    x = torch.tensor([[3, 1, 1, 2, 0, 0], [1, 2, 3, 3, 3, 2]])
    assert token_counts(x, 4).tolist() == [[0, 2, 1, 1], [0, 1, 2, 3]]
    assert token_counts(x, 4, window=2).tolist() == [[0, 1, 1, 0], [0, 0, 1, 1]]
    with pytest.raises(ArgumentError, match="window must"):
        token_counts(x, 4, window=0)


@dataclass(frozen=True)
class _MajorityToken:
    """Label = which of tokens 1, 2, 3 is most frequent: decided by the counts alone."""

    name = "majority_token"
    vocab_size = 5
    num_classes = 3

    def sample(self, n, generator):
        winner = torch.randint(0, 3, (n,), generator=generator)
        x = torch.randint(1, 5, (n, 60), generator=generator)
        x[:, :12] = winner.view(n, 1) + 1  # twelve extra votes for the winner
        return {"inputs": x, "targets": winner}


def test_the_bag_of_tokens_classifier_learns_a_label_that_counts_decide():
    accuracy, chance = bag_of_tokens_accuracy(_MajorityToken(), train=600, test=300)
    assert accuracy > 0.9 and chance < 0.45


def test_solve_names_the_tasks_it_knows():
    with pytest.raises(ArgumentError, match="task must be one of"):
        solve(tasks.get("mqar"), tasks.get("mqar").sample(2))
