"""The suite's time estimate (src/attnkit/tour/long/estimate.py): counted FLOPs against a hand count, the budgets."""

from __future__ import annotations

import re

import pytest

from attnkit.lab.tour.long import estimate
from attnkit.lab.tour.long.suite import plan
from tests.user_docs import guide


def _dense_model_flops(setup) -> int:
    """Dense softmax's encoder by hand, forward and backward (3x forward), one sequence: every matrix product."""
    task = setup.make()
    n, d, ff, layers = task.length, setup.model.dim, setup.model.ff, setup.model.layers
    per_block = 2 * n * (4 * d * d + 2 * d * ff) + 4 * n * n * d  # q, k, v, out; the feed-forward; QK^T and PV
    head = 2 * (n if task.kind == "tokens" else 1) * d * task.num_classes
    return 3 * (layers * per_block + head)


@pytest.mark.parametrize("scale", ["default", "lra"])
def test_a_steps_flops_are_the_dense_models_matrix_products(scale):
    for setup in plan(scale).setups:
        expected = _dense_model_flops(setup) * setup.budget.batch_size
        assert estimate.step_flops(setup) == pytest.approx(expected, rel=0.01), setup.task


def test_the_default_scale_fits_its_cpu_budget():
    """At most 40 process-minutes (two single-thread runs at once: 20 minutes), dense softmax's cost for every run."""
    assert estimate.plan_seconds(plan()) <= 40 * 60
    assert estimate.plan_seconds(plan("quick")) <= 30


def test_the_tour_guide_states_the_lra_scales_estimate():
    seconds = estimate.plan_seconds(plan("lra"), rate=estimate.GPU_RATE, overhead=estimate.GPU_STEP)
    stated = re.search(r"about (\d+) hours on one GPU", guide("tour"))
    assert stated and int(stated.group(1)) == round(seconds / 3600), (stated, seconds / 3600)
