"""The long suite's classifier (src/attnkit/tour/long/model.py): matched parameters, pooling over real tokens."""

from __future__ import annotations

import pytest
import torch

from attnkit.tour.experiments.train import count_parameters
from attnkit.tour.long.model import TOLERANCE, LongClassifier, build
from attnkit.tour.long.roster import MECHANISMS, Sizes
from attnkit.tour.long.suite import DIM, HEADS, LAYERS, TASKS, plan, sizes_of


def _suite_models(quick: bool):
    for task_name in plan(quick).tasks if quick else TASKS:
        spec = TASKS[task_name]
        task = spec.make(quick)
        for name, mech in MECHANISMS.items():
            if spec.image or not mech.images_only:
                yield task_name, name, task, sizes_of(spec, task)


@pytest.mark.parametrize("quick", [False, True])
def test_every_roster_entry_matches_softmax_parameter_count_on_every_task(quick):
    seen = set()
    for task_name, name, task, sizes in _suite_models(quick):
        dense = count_parameters(build(task.vocab_size, task.num_classes, sizes, layers=LAYERS, name="softmax"))
        count = count_parameters(build(task.vocab_size, task.num_classes, sizes, layers=LAYERS, name=name))
        assert abs(count - dense) <= TOLERANCE * dense, (task_name, name, count, dense)
        seen.add(name)
    assert seen == set(MECHANISMS)


def test_the_suite_sizes_are_the_stated_ones():
    for task_name, _, _, sizes in _suite_models(False):
        assert (sizes.dim, sizes.heads) == (DIM, HEADS) and 512 <= sizes.length <= 2048, task_name


@pytest.mark.parametrize("name", ["softmax", "perceiver", "bigbird"])
def test_mean_pooling_averages_the_real_positions_only(name):
    """Mean pooling averages the real positions: with every position real, it is the plain mean."""
    torch.manual_seed(0)
    model = LongClassifier(20, 3, Sizes(32, 16, 2), layers=1, width=32 if name != "perceiver" else 8,
                           name=name).eval()
    tokens = torch.randint(1, 20, (2, 32), generator=torch.Generator().manual_seed(1))
    logits = model(tokens)
    assert logits.shape == (2, 3) and torch.isfinite(logits).all()
    if name != "perceiver":
        hidden = model.body(model.embed(tokens)).double().mean(1)
        expected = hidden @ model.head.weight.double().T + model.head.bias.double()
        assert torch.allclose(logits.double(), expected, atol=1e-5)
        padded = tokens.clone()
        padded[:, -4:] = 0
        hidden = model.body(model.embed(padded)).double()[:, :-4].mean(1)  # the padded positions are left out
        expected = hidden @ model.head.weight.double().T + model.head.bias.double()
        assert torch.allclose(model(padded).double(), expected, atol=1e-5)
