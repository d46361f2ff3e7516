"""Train one (task, mechanism) pair of the long-range suite for its seeds, in this process, at one thread.

Each seed is a run of the tour's loop (:func:`attnkit.lab.tour.experiments.train.fit`: AdamW, warm-up
then cosine, clipping, fresh seeded batches) on :class:`.model.LongClassifier`, scored on a held-out
test batch drawn apart from the training stream. Per run it records the test accuracy, the chance
level of that test batch (the share of its most common label), the training speed (steps per
second over the timed training steps only) and the peak memory.

Peak memory (:class:`~attnkit.lab.tour.experiments.train.PeakMemory`): on the CPU, the growth of this
process's peak resident size over its size before the first seed was built. The runner starts one
fresh process per pair, and the seeds of a pair have the same shapes, so this is the peak of
training one model at the task's length (a later seed reuses memory an earlier one freed, and
would show nothing by itself). On CUDA, the peak of allocated memory over what was allocated before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F

from ...tasks import IGNORE_INDEX
from ..experiments.tokens import TokenObjective
from ..experiments.train import Objective, PeakMemory, Result, count_parameters, evaluate, fit
from .model import build
from .suite import plan, sizes_of

__all__ = ["ClassifyObjective", "train_pair", "key_of", "chance", "score"]

_EVAL_SEED, _TEST_SEED = 1_000_003, 2_000_003  # as the default tour: never the training stream


class ClassifyObjective(Objective):
    """One label per sequence: cross-entropy of the logits ``(B, C)``, and the task's accuracy of their argmax."""

    def loss(self, model, batch, task):
        return F.cross_entropy(model(batch["inputs"]), batch["targets"])

    def score(self, model, batch, task):
        return task.accuracy(model(batch["inputs"]).argmax(-1), batch)


def key_of(task: str, mechanism: str) -> str:
    """The pair's key ``"task/mechanism"`` (as the default tour's experiment keys)."""
    return f"{task}/{mechanism}"


def chance(targets: torch.Tensor) -> float:
    """The accuracy of always answering the most common label of ``targets`` (scored positions only)."""
    scored = targets[targets != IGNORE_INDEX]
    return torch.bincount(scored).max().item() / scored.numel()


def score(model, objective: Objective, batch: dict[str, torch.Tensor], task, chunk: int) -> float:
    """:func:`evaluate` over ``batch`` in pieces of ``chunk`` sequences, weighted by what each piece scores.

    Pieces no larger than a training batch keep the evaluation's memory below training's, so the
    pair's peak memory is training's.
    """
    total = weight = 0.0
    for i in range(0, len(batch["targets"]), chunk):
        part = {k: v[i:i + chunk] for k, v in batch.items()}
        count = int((part["targets"] != IGNORE_INDEX).sum()) if task.kind == "tokens" else len(part["targets"])
        total += evaluate(model, objective, part, task) * count
        weight += count
    return total / weight


def train_pair(task_name: str, mechanism: str, seeds, *, scale: str = "default", device: str = "cpu",
               progress: Callable[[str], None] | None = None, emit: Callable[[Result], None] | None = None,
               lr_scale: float = 1.0) -> list[Result]:
    """Train ``mechanism`` on ``task_name`` once per seed (the scale's setup), one thread; each :class:`Result`.

    ``emit(result)`` is called as each seed finishes (the child process prints it at once, so an
    interrupted pair keeps its finished seeds); ``progress(label)`` once per curve point.
    ``Result.extra`` holds ``steps_per_second``, ``length`` and ``chance``; ``lr_scale`` multiplies the
    setup's learning rate (a sweep's point).
    """
    the_plan = plan(scale)
    setup = the_plan.setup(task_name)
    budget, threads = setup.budget, torch.get_num_threads()
    if lr_scale != 1:
        budget = replace(budget, lr=budget.lr * lr_scale)
    torch.set_num_threads(1)
    peak, results = PeakMemory(device), []
    peak.start()
    try:
        task = setup.make()
        sizes = sizes_of(setup, task)
        objective = TokenObjective() if task.kind == "tokens" else ClassifyObjective()
        for seed in seeds:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = build(task.vocab_size, task.num_classes, sizes, layers=setup.model.layers,
                              ff=setup.model.ff, name=mechanism, per_position=task.kind == "tokens",
                              questions=task.question_positions)
                eval_batch = task.sample(budget.eval_size, torch.Generator().manual_seed(seed + _EVAL_SEED))
                trained = fit(model, task, objective, budget, generator=torch.Generator().manual_seed(seed),
                              eval_batch=eval_batch, evals=the_plan.evals, progress=progress, device=device)
                test = task.sample(budget.test_size, torch.Generator().manual_seed(seed + _TEST_SEED))
                accuracy = score(model, objective, test, task, budget.batch_size)
            extra = {"steps_per_second": budget.steps / trained.seconds, "length": sizes.length,
                     "chance": chance(test["targets"])}
            result = Result(key_of(task_name, mechanism), task_name, mechanism, seed, accuracy, trained.seconds,
                            peak.bytes(), count_parameters(model), trained.curve, extra=extra)
            results.append(result)
            if progress is not None:
                progress(f"seed {seed}: test {accuracy:.3f}")
            if emit is not None:
                emit(result)
    finally:
        torch.set_num_threads(threads)
    return results
