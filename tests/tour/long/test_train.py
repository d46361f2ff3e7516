"""Training one pair of the long suite (src/attnkit/tour/long/train.py) and its speed measurement (speed.py)."""

from __future__ import annotations

import torch

from attnkit.tour.experiments.train import count_parameters
from attnkit.tour.long.model import build
from attnkit.tour.long.speed import CLASSES, VOCAB, measure_speed
from attnkit.tour.long.suite import LAYERS, QUICK_BUDGET, TASKS, plan, sizes_of
from attnkit.tour.long.train import ClassifyObjective, train_pair


def test_a_pair_trains_each_seed_reproducibly_and_reports_speed_and_memory():
    emitted = []
    first = train_pair("byte_retrieval", "linear", [0, 1], quick=True, emit=emitted.append)
    again = train_pair("byte_retrieval", "linear", [1], quick=True)
    assert [r.seed for r in first] == [0, 1] and emitted == first
    assert again[0].accuracy == first[1].accuracy and again[0].curve == first[1].curve
    length = TASKS["byte_retrieval"].make(True).length
    for r in first:
        assert r.key == "byte_retrieval/linear" and 0 <= r.accuracy <= 1 and r.extra["length"] == length
        assert r.extra["steps_per_second"] == QUICK_BUDGET.steps / r.train_seconds
        assert r.curve[-1][0] == QUICK_BUDGET.steps and len(r.curve) == plan(True).evals
        assert r.peak_bytes is None or r.peak_bytes >= 0


def test_the_objective_is_cross_entropy_of_one_label_per_sequence():
    spec = TASKS["byte_retrieval"]
    task = spec.make(True)
    torch.manual_seed(0)
    model = build(task.vocab_size, task.num_classes, sizes_of(spec, task), layers=LAYERS, name="softmax")
    batch = task.sample(4, torch.Generator().manual_seed(0))
    logits = model(batch["inputs"]).double()
    manual = -(logits.log_softmax(-1).gather(1, batch["targets"][:, None])).mean()
    assert torch.allclose(ClassifyObjective().loss(model, batch, task).double(), manual, atol=1e-6)
    assert ClassifyObjective().score(model, batch, task) == (logits.argmax(-1) == batch["targets"]).double().mean()


def test_the_speed_measurement_times_the_suite_model_at_the_given_length():
    res = measure_speed("linear", 64, steps=1)
    assert res["mechanism"] == "linear" and res["length"] == 64 and res["steps"] == 1
    assert res["steps_per_second"] == 1 / res["seconds"] > 0
    from attnkit.tour.long.roster import Sizes
    from attnkit.tour.long.suite import DIM, HEADS

    torch.manual_seed(0)
    expected = count_parameters(build(VOCAB, CLASSES, Sizes(64, DIM, HEADS), layers=LAYERS, name="linear"))
    assert res["parameters"] == expected
