"""The classic-module experiments (src/attnkit/tour/experiments/classic.py and the coverage pair): each builds and
trains two steps through the tour's own loop; the REINFORCE loss and the test-time choice of hard attention."""

import math

import pytest
import torch

import attnkit.lab.tour as tour
from attnkit.errors import ArgumentError
from attnkit.lab import tasks
from attnkit.lab.tour.experiments import _train
from attnkit.lab.tour.experiments.classic import (
    HardObjective,
    MemoryLM,
    MemoryObjective,
    OnePositionClassifier,
    QuestionModel,
)
from attnkit.lab.tour.experiments.train import Budget

CLASSIC = [k for k in tour.experiments() if k.split("/")[0] in
           ("key_summaries", "deciding_position", "repeated_block", "document_questions")]
TWO_STEPS = Budget(steps=2, batch_size=8, eval_size=16, test_size=16)


def test_the_classic_experiments_are_in_the_default_tour():
    assert len(CLASSIC) == 9 and set(CLASSIC) <= set(tour.default_set(False))


@pytest.mark.parametrize("key", CLASSIC)
def test_two_training_steps_through_the_tour_loop(key):
    exp = tour.experiments()[key]
    result = _train(key, exp, TWO_STEPS, 0, None)
    assert [p[0] for p in result.curve] == [1, 2] and all(math.isfinite(p[1]) for p in result.curve)
    assert 0.0 <= result.accuracy <= 1.0 and result.parameters > 0


def test_reinforce_loss_is_cross_entropy_minus_the_advantage_weighted_log_probability():
    task = tasks.get("deciding_position", length=6, num_values=3)
    batch = task.sample(16, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = OnePositionClassifier(task.vocab_size, task.num_classes, dim=8, mode="stochastic")
    torch.manual_seed(1)
    loss = HardObjective().loss(model, batch, task)
    torch.manual_seed(1)  # the same sampled locations
    logits, out = model(batch["inputs"])
    ce = torch.nn.functional.cross_entropy(logits, batch["targets"], reduction="none")
    reward = -ce.detach()
    expected = ce.mean() - ((reward - reward.mean()) * out.log_prob[:, 0]).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert bool((out.weights.sum(-1) == 1).all()) and bool(((out.weights == 0) | (out.weights == 1)).all())


def test_stochastic_model_chooses_the_most_likely_location_in_eval():
    task = tasks.get("deciding_position", length=6, num_values=3)
    batch = task.sample(16, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = OnePositionClassifier(task.vocab_size, task.num_classes, dim=8, mode="stochastic").eval()
    a, out = model(batch["inputs"])
    b, _ = model(batch["inputs"])
    assert torch.equal(a, b)  # deterministic in eval
    picked = model.embed(batch["inputs"])[torch.arange(16), out.probs[:, 0].argmax(-1)]
    assert torch.allclose(a, model.out(picked))


def test_memory_extra_reads_the_slot_of_the_needed_state(monkeypatch):
    task = tasks.get("repeated_block", period=3, length=9, vocab=5)
    batch = task.sample(4, torch.Generator().manual_seed(0))
    model = MemoryLM(task.vocab_size, dim=4, hidden_dim=6, memory_size=4)
    for slot, share in ((2, 1.0), (3, 0.0)):  # K = 4, needed state 2 back: slot j holds h_{t-4+j}, so slot 2
        def one_hot(h, slot=slot):
            weights = torch.zeros(*h.shape[:2], 4)
            weights[..., slot] = 1.0
            return torch.zeros_like(h), weights
        monkeypatch.setattr(model.memory, "forward", one_hot)
        with torch.no_grad():
            assert MemoryObjective().extra(model, batch, task) == {"memory_on_needed_state": share}
    assert MemoryObjective().extra(MemoryLM(task.vocab_size, dim=4, hidden_dim=6), batch, task) == {}


def test_question_model_rejects_an_unknown_reader():
    with pytest.raises(ArgumentError, match="reader must be one of"):
        QuestionModel(10, 3, reader="bag")
