"""The tour's experiments: (task, mechanism) pairs with their model, budget and objective, and :func:`run`.

``experiments()`` maps stable keys ``"task/mechanism"`` to :class:`Experiment`;
``default_set(quick)`` lists the keys of the default tour; ``run(key, seed)`` trains one
experiment with :func:`attnkit.lab.tour.experiments.train.fit` and returns its
:class:`~attnkit.lab.tour.experiments.train.Result`. A run is deterministic for a seed: the model is
initialised under ``torch.manual_seed(seed)`` (inside :func:`torch.random.fork_rng`, so the
caller's global RNG is left as it was), training batches come from a generator seeded
with ``seed``, and the evaluation and test batches from generators seeded apart from it.

A run trains on one CPU thread (the caller's setting is restored afterwards): these models
are too small to gain from more, and at two threads on a busy machine their many small
operations slow down up to tenfold (DESIGN.md, section 6); one thread also makes the
numbers independent of the machine's core count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import NamedTuple

import torch
from torch import nn

from ....errors import ArgumentError, check_int
from ...tasks import Task
from .train import Budget, Objective, Result, count_parameters, evaluate, fit

__all__ = ["Built", "Experiment", "experiments", "default_set", "run", "EVALS"]

EVALS = 10  # curve points per run (one progress step each)
_EVAL_SEED, _TEST_SEED = 1_000_003, 2_000_003  # offsets: eval/test batches never share the training stream


class Built(NamedTuple):
    """What an experiment's ``build()`` returns: the model, the training task, the test task, the objective."""

    model: nn.Module
    task: Task
    test_task: Task
    objective: Objective


@dataclass(frozen=True)
class Experiment:
    """One tour experiment: a task, a mechanism, and how to build and train the model.

    ``build()`` makes the model from the global RNG (seeded by :func:`run`) and the tasks;
    ``budget`` and ``quick`` are the default and ``--quick`` training budgets. ``cost_name``
    and ``cost_sizes`` (pairs) name the :mod:`attnkit.costing.analytic` formula of the mechanism
    and its sizes for the report; ``steps`` is the number of progress calls of a run; ``uses``
    names the registry entries (:func:`attnkit.registry.entries`) the model exercises
    (:mod:`attnkit.lab.tour.catalogue` checks them).
    """

    task: str
    mechanism: str
    description: str
    build: Callable[[], Built]
    budget: Budget
    quick: Budget
    cost_name: str | None = None
    cost_sizes: tuple[tuple[str, int], ...] = ()
    steps: int = EVALS + 1
    uses: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.task}/{self.mechanism}"


@lru_cache(maxsize=1)
def _registry() -> dict[str, Experiment]:
    from .catalog import catalog

    found = {}
    for exp in catalog():
        if exp.key in found:
            raise ValueError(f"tour: experiment key {exp.key!r} is defined twice")
        found[exp.key] = exp
    return found


def experiments() -> dict[str, Experiment]:
    """Every experiment by key ``"task/mechanism"``, in tour order."""
    return dict(_registry())


def default_set(quick: bool) -> list[str]:
    """The keys of the default tour (``quick``: the short tour's subset)."""
    from .catalog import DEFAULT, QUICK

    return list(QUICK if quick else DEFAULT)


def run(key: str, seed: int, *, quick: bool = False, progress: Callable[[str], None] | None = None,
        device: str = "cpu", lr_scale: float = 1.0) -> Result:
    """Train experiment ``key`` with ``seed`` and return its :class:`Result` (test metric, cost, curve, maps).

    Args:
        key: an experiment key from :func:`experiments`.
        seed: a non-negative int; the same seed gives the same result on the same machine.
        quick: use the experiment's short budget.
        progress: called with a label once per curve point and once after the test.
        device: where the model trains (``"cpu"`` or ``"cuda"``); the maps and measurements come back on the CPU.
        lr_scale: a positive factor of the budget's learning rate (a sweep's point; 1: the experiment's own rate).
    """
    exps = _registry()
    if key not in exps:
        raise ArgumentError(f"tour.run: unknown experiment {key!r}; known: {', '.join(exps)}")
    check_int("tour.run", "seed", seed, 0)
    if not (isinstance(lr_scale, (int, float)) and lr_scale > 0):
        raise ArgumentError(f"tour.run: lr_scale must be a positive number; got {lr_scale!r}")
    exp = exps[key]
    budget = exp.quick if quick else exp.budget
    if lr_scale != 1:
        budget = replace(budget, lr=budget.lr * lr_scale)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = _train(key, exp, budget, seed, progress, torch.device(device))
    finally:
        torch.set_num_threads(threads)
    return result


def _train(key: str, exp: Experiment, budget: Budget, seed: int, progress, device: torch.device | str = "cpu"
           ) -> Result:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, task, test_task, objective = exp.build()
        eval_batch = test_task.sample(budget.eval_size, torch.Generator().manual_seed(seed + _EVAL_SEED))
        trained = fit(model, task, objective, budget, generator=torch.Generator().manual_seed(seed),
                      eval_batch=eval_batch, evals=EVALS, progress=progress, device=device)
        test_batch = test_task.sample(budget.test_size, torch.Generator().manual_seed(seed + _TEST_SEED))
        accuracy = evaluate(model, objective, test_batch, test_task)
        model.to("cpu")  # the maps and extra measurements read the model on the CPU, as the tasks draw there
        with torch.no_grad():
            examples = objective.examples(model, test_batch, test_task)
            extra = objective.extra(model, test_batch, test_task)
    if progress is not None:
        progress(f"test {accuracy:.3f}")
    return Result(key, exp.task, exp.mechanism, seed, accuracy, trained.seconds, trained.peak_bytes,
                  count_parameters(model), trained.curve, examples, extra)
