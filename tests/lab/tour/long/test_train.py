"""Training one pair of the long suite (src/attnkit/tour/long/train.py) and its speed measurement (speed.py)."""

from __future__ import annotations

import math

import pytest
import torch

from attnkit.lab import tasks
from attnkit.lab.tour.experiments.tokens import TokenObjective
from attnkit.lab.tour.experiments.train import count_parameters
from attnkit.lab.tour.long.model import build
from attnkit.lab.tour.long.roster import Sizes
from attnkit.lab.tour.long.speed import CLASSES, VOCAB, measure_speed
from attnkit.lab.tour.long.suite import CHOSEN_BLOCKS, ModelSize, plan, sizes_of
from attnkit.lab.tour.long.train import ClassifyObjective, chance, score, train_pair

QUICK = plan("quick")


def test_a_pair_trains_each_seed_reproducibly_and_reports_speed_memory_and_chance():
    emitted = []
    first = train_pair("byte_context", "linear", [0, 1], scale="quick", emit=emitted.append)
    again = train_pair("byte_context", "linear", [1], scale="quick")
    assert [r.seed for r in first] == [0, 1] and emitted == first
    assert again[0].accuracy == first[1].accuracy and again[0].curve == first[1].curve
    setup = QUICK.setup("byte_context")
    for r in first:
        assert r.key == "byte_context/linear" and 0 <= r.accuracy <= 1 and r.extra["length"] == setup.make().length
        assert r.extra["steps_per_second"] == setup.budget.steps / r.train_seconds
        assert r.curve[-1][0] == setup.budget.steps and len(r.curve) == QUICK.evals
        assert 0.5 <= r.extra["chance"] <= 1 and (r.peak_bytes is None or r.peak_bytes >= 0)


@pytest.mark.parametrize("name", CHOSEN_BLOCKS)
def test_nsa_and_moba_train_a_few_steps_on_the_quick_recall_and_are_scored(name):
    setup = QUICK.setup("associative_recall")
    (result,) = train_pair("associative_recall", name, [0], scale="quick")
    assert result.key == f"associative_recall/{name}" and 0 <= result.accuracy <= 1
    assert result.extra["length"] == setup.make().length and result.curve[-1][0] == setup.budget.steps
    assert all(math.isfinite(loss) and 0 <= acc <= 1 for _, loss, acc in result.curve)


def test_chance_is_the_share_of_the_most_common_scored_label():
    assert chance(torch.tensor([[1, -100, 1], [0, 1, -100]])) == 0.75
    assert chance(torch.tensor([2, 0, 2, 1])) == 0.5


def test_scoring_in_pieces_weighs_each_piece_by_what_it_scores():
    setup = QUICK.setup("associative_recall")
    task = setup.make()
    torch.manual_seed(0)
    model = build(task.vocab_size, task.num_classes, sizes_of(setup, task), layers=1, ff=setup.model.ff,
                  name="softmax", per_position=True).eval()
    batch = task.sample(7, torch.Generator().manual_seed(0))
    batch["targets"][0] = -100  # a sequence with nothing to score must not weigh
    with torch.no_grad():
        predicted = model(batch["inputs"]).argmax(-1)
    scored = batch["targets"] != -100
    whole = (predicted[scored] == batch["targets"][scored]).double().mean().item()
    assert abs(score(model, TokenObjective(), batch, task, 3) - whole) < 1e-12


def test_the_objective_is_cross_entropy_of_one_label_per_sequence():
    task = tasks.get("byte_text", length=64, num_facts=4)
    torch.manual_seed(0)
    model = build(task.vocab_size, task.num_classes, Sizes(64, 32, 2), layers=1, ff=64, name="softmax")
    batch = task.sample(4, torch.Generator().manual_seed(0))
    logits = model(batch["inputs"]).double()
    manual = -(logits.log_softmax(-1).gather(1, batch["targets"][:, None])).mean()
    assert torch.allclose(ClassifyObjective().loss(model, batch, task).double(), manual, atol=1e-6)
    assert ClassifyObjective().score(model, batch, task) == (logits.argmax(-1) == batch["targets"]).double().mean()


def test_the_speed_measurement_times_each_step_of_the_suite_model():
    size = ModelSize(16, 2, 1, 32)
    res = measure_speed("linear", 64, size, steps=3)
    assert res["mechanism"] == "linear" and res["length"] == 64 and res["steps"] == 3
    assert len(res["step_seconds"]) == 3 and abs(sum(res["step_seconds"]) - res["seconds"]) < 1e-12
    assert res["steps_per_second"] == 3 / res["seconds"] > 0 and res["device"] == "cpu"
    torch.manual_seed(0)
    expected = count_parameters(build(VOCAB, CLASSES, Sizes(64, 16, 2), layers=1, ff=32, name="linear"))
    assert res["parameters"] == expected
