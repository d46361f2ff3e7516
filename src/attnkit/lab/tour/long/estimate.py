"""How long a scale of the suite takes: counted FLOPs of a training step, times steps and runs, at a given rate.

A step's FLOPs are those of dense softmax's model on one sequence, forward and backward, times the
batch: the projections, feed-forward blocks and head counted by
:class:`torch.utils.flop_counter.FlopCounterMode` on the meta device (no memory, no data), plus the
dense attention, ``12 L^2 dim`` per block (``QK^T`` and ``PV``, ``2 L^2 dim`` FLOPs each forward, the
backward twice the forward). The other mechanisms do less attention work, so this bounds their FLOPs
from above, but a gather-heavy kernel (Reformer's sorted buckets, a generic block-sparse layout)
runs at a lower rate than dense matrix products, so it is a rough guide for those. A step takes
``max(FLOPs / rate, overhead)`` seconds (a small model's step is bound by kernel launches, not
FLOPs); a run adds its evaluation (forward only, a third of a training step per sequence).

:data:`GPU_RATE` and :data:`GPU_STEP` are assumptions for one current data-centre GPU in float32
with TF32 matrix products; :data:`CPU_RATE` is what one thread of the 2-core machine the default
scale was designed on sustained on these models' dense attention.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch.utils.flop_counter import FlopCounterMode

from .model import build
from .suite import Plan, Setup, sizes_of

__all__ = ["step_flops", "run_seconds", "plan_seconds", "GPU_RATE", "GPU_STEP", "CPU_RATE", "CPU_STEP"]

GPU_RATE, GPU_STEP = 100e12, 0.01  # FLOP/s sustained, and the shortest step (launch-bound), on one GPU
CPU_RATE, CPU_STEP = 30e9, 0.005  # one CPU thread


@lru_cache(maxsize=64)
def _per_sequence(setup: Setup) -> int:
    """Dense softmax's FLOPs for one sequence of ``setup``'s task, forward and backward."""
    task = setup.make()
    sizes = sizes_of(setup, task)
    with torch.device("meta"):
        model = build(task.vocab_size, task.num_classes, sizes, layers=setup.model.layers, ff=setup.model.ff,
                      name="softmax", per_position=task.kind == "tokens")
        inputs = torch.ones(1, sizes.length, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        model(inputs).float().sum().backward()
    return counter.get_total_flops() + 12 * setup.model.layers * sizes.length ** 2 * setup.model.dim


def step_flops(setup: Setup) -> int:
    """FLOPs of one training step of ``setup`` (a batch of ``budget.batch_size`` sequences)."""
    return _per_sequence(setup) * setup.budget.batch_size


def run_seconds(setup: Setup, evals: int, rate: float, overhead: float) -> float:
    """Seconds one seed of one mechanism of ``setup`` takes: its steps, its evaluations and its test."""
    b = setup.budget
    step = max(step_flops(setup) / rate, overhead)
    forward = _per_sequence(setup) / 3 / rate  # one sequence, forward only
    return b.steps * step + (evals * b.eval_size + b.test_size) * forward


def plan_seconds(the_plan: Plan, *, rate: float = CPU_RATE, overhead: float = CPU_STEP) -> float:
    """Seconds of one process (one thread, or one GPU) that every run of ``the_plan`` takes together."""
    return sum(run_seconds(s, the_plan.evals, rate, overhead) * len(s.mechanisms) * len(s.seeds)
               for s in the_plan.setups)
