"""The tour's gate and differential-attention experiments: the sink measure, the objective, the claims.

The fast tests check the objective and the catalogue; the slow ones train through
:func:`attnkit.lab.tour.run` (seed 0; the orderings held for seeds 0-1 when the budgets were set):
the gate lowers the weight on BOS (Qiu et al. 2025), differential attention recalls among
distractors where softmax does not yet (Ye et al. 2024).
"""

from __future__ import annotations

from functools import cache

import pytest
import torch
import torch.nn.functional as F

import attnkit.lab.tour as tour
from attnkit.lab.tour.experiments.sinks import first_token_mass
from attnkit.lab.tour.experiments.tokens import record_maps

KEYS = ("bigram_backcopy/softmax", "bigram_backcopy/gated", "mqar/distractors-softmax", "mqar/distractors-differential")


def test_sink_objective_and_first_token_mass():
    built = dict(tour.experiments())["bigram_backcopy/gated"].build()
    model, task, objective = built.model, built.task, built.objective
    batch = task.sample(4, torch.Generator().manual_seed(1))
    loss = objective.loss(model, batch, task)
    want = F.cross_entropy(model(batch["inputs"]).reshape(-1, task.vocab_size), batch["next"].reshape(-1))
    torch.testing.assert_close(loss, want)
    mass = first_token_mass(record_maps(model, batch["inputs"]))
    assert 0 < mass < 1 and objective.extra(model, batch, task) == {"first_token_mass": mass}
    assert objective.labels([0, 5, 23], task) == ["BOS", "5", "T23"]


def test_the_experiments_are_in_the_catalog_and_build():
    exps = tour.experiments()
    for key in KEYS:
        built = exps[key].build()
        batch = built.task.sample(2, torch.Generator().manual_seed(0))
        assert built.model(batch["inputs"]).shape[:2] == batch["inputs"].shape
    diff = exps["mqar/distractors-differential"].build().model
    lambdas = [layer.self_attn.lambda_init for layer in diff.body.layers]
    assert lambdas == pytest.approx([0.2, 0.8 - 0.6 * 2.718281828459045 ** -0.3])


@cache
def result(key: str):
    return tour.run(key, 0)


@pytest.mark.slow
def test_the_gate_lowers_the_weight_on_the_first_token():
    plain, gated = result("bigram_backcopy/softmax"), result("bigram_backcopy/gated")
    assert plain.accuracy >= 0.95 and gated.accuracy >= 0.95
    assert gated.extra["first_token_mass"] < 0.6 * plain.extra["first_token_mass"], (gated.extra, plain.extra)


@pytest.mark.slow
def test_differential_attention_recalls_among_distractors():
    plain, diff = result("mqar/distractors-softmax"), result("mqar/distractors-differential")
    assert diff.accuracy >= plain.accuracy + 0.3, (diff.accuracy, plain.accuracy)
