"""tour/experiments/sinks.py: the sink experiment's model, its metric, and (slow) the claim at CPU scale."""

from __future__ import annotations

import pytest
import torch

import attnkit.lab.tour as tour
from attnkit.lab import tasks
from attnkit.lab.tour.experiments.catalog import MQAR
from attnkit.lab.tour.experiments.sinks import SinkObjective, first_token_mass, with_sinks
from attnkit.lab.tour.experiments.tokens import language_model
from attnkit.nn.multihead import MultiHeadAttention


def test_with_sinks_gives_every_attention_layer_a_sink_per_head():
    task = tasks.get("mqar", **MQAR)
    model = with_sinks(language_model(task, "softmax", layers=2))
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(layers) == 2 and all(m.sinks.shape == (m.num_heads,) and not m.sinks.any() for m in layers)
    assert sum(n.endswith("sinks") for n, _ in model.named_parameters()) == 2
    batch = task.sample(4, generator=torch.Generator().manual_seed(0))
    found = SinkObjective().extra(model, batch, task)
    assert set(found) == {"attention_on_bound_value", "first_token_mass"} and 0 < found["first_token_mass"] < 1


def test_first_token_mass_averages_key_zero_over_the_later_queries():
    w = torch.zeros(1, 2, 3, 3)
    w[0, 0, :, 0] = torch.tensor([1.0, 0.5, 0.25])  # query 0 (it sees only key 0) is left out
    w[0, 1, :, 0] = torch.tensor([1.0, 0.1, 0.15])
    assert first_token_mass({"layer 0": w, "layer 1": torch.zeros(1, 2, 3, 3)}) == pytest.approx(0.25 / 2)


@pytest.mark.slow
def test_learned_sinks_lower_the_first_tokens_mass_and_keep_recall():
    plain, sinks = tour.run("mqar/softmax-2layer", 0), tour.run("mqar/softmax-sinks", 0)
    assert sinks.accuracy >= 0.95
    assert sinks.extra["first_token_mass"] < 0.9 * plain.extra["first_token_mass"]
