"""The long-context recall experiment: settings that put every pair out of a window's reach, runs, the claim."""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.tour.long import recall


@pytest.mark.parametrize("scale", sorted(recall.SETTINGS))
def test_every_pair_lies_beyond_the_windows_reach_and_the_length_is_long(scale):
    s = recall.SETTINGS[scale]
    batch = recall.task(s).sample(3, torch.Generator().manual_seed(0))
    assert batch["inputs"].shape[1] == s.length
    first_query = 2 * s.pairs + s.gap
    assert first_query - (2 * s.pairs - 1) > s.window * s.layers  # the nearest pair token, from the first query
    if scale == "default":
        assert s.length >= 2048


@pytest.mark.parametrize("name", recall.MECHANISMS)
def test_each_mechanism_trains_a_few_steps_and_is_scored(name):
    result = recall.train_recall(name, 0, scale="quick")
    assert result.mechanism == name and 0.0 <= result.accuracy <= 1.0 and result.extra["length"] == 256
    model = recall.build(name, recall.SETTINGS["quick"])
    assert model(torch.zeros(2, 256, dtype=torch.long)).shape == (2, 256, recall.task(recall.SETTINGS["quick"]
                                                                                        ).vocab_size)


def test_the_claim_holds_only_when_every_seed_orders():
    good = {"softmax": [0.9, 0.95], "nsa": [0.8, 0.85], "moba": [0.7, 0.9], "sliding-window": [0.1, 0.12]}
    assert recall.holds(good) == (True, [])
    held, failures = recall.holds({**good, "moba": [0.11, 0.9]})
    assert held is False and failures == ["moba (worst seed 0.110) not above sliding-window (best seed 0.120)"]
    assert recall.holds({k: v for k, v in good.items() if k != "nsa"})[0] is None


def test_unknown_names_are_refused():
    with pytest.raises(ArgumentError, match="unknown mechanism 'window'"):
        recall.build("window", recall.SETTINGS["quick"])
    with pytest.raises(ArgumentError, match="scale must be one of"):
        recall.train_recall("softmax", 0, scale="huge")
