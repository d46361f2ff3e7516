"""Train one (task, mechanism) pair of the long-range suite for its seeds, in this process, at one thread.

Each seed is a run of the tour's loop (:func:`attnkit.tour.experiments.train.fit`: AdamW, warm-up
then cosine, clipping, fresh seeded batches) on :class:`.model.LongClassifier`, scored on a held-out
test batch drawn apart from the training stream. Per run it records the test accuracy, the training
speed (steps per second over the timed training steps only) and the peak memory.

Peak memory: the growth of this process's peak resident size (VmHWM) over its size before the
first seed was built. The runner starts one fresh process per pair, and the seeds of a pair have
the same shapes, so this is the peak of training one model at the task's length (a later seed
reuses memory an earlier one freed, and would show nothing by itself). None off Linux.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ...analysis import memory
from ..experiments.train import Objective, Result, count_parameters, evaluate, fit
from .model import build
from .suite import LAYERS, plan, sizes_of, suite_task

__all__ = ["ClassifyObjective", "train_pair", "key_of"]

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


def _resident(field: str) -> int | None:
    try:
        return memory.resident_bytes(field)
    except (OSError, RuntimeError):
        return None


def train_pair(task_name: str, mechanism: str, seeds, *, quick: bool = False,
               progress: Callable[[str], None] | None = None, emit: Callable[[Result], None] | None = None
               ) -> list[Result]:
    """Train ``mechanism`` on ``task_name`` once per seed (the mode's plan), one thread; each :class:`Result` in order.

    ``emit(result)`` is called as each seed finishes (the child process prints it at once, so an
    interrupted pair keeps its finished seeds); ``progress(label)`` once per curve point.
    ``Result.extra`` holds ``steps_per_second`` and ``length``.
    """
    spec, mode = suite_task(task_name), plan(quick)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    base, peak, results = _resident("VmRSS"), None, []
    try:
        task = spec.make(quick)
        sizes = sizes_of(spec, task)
        for seed in seeds:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = build(task.vocab_size, task.num_classes, sizes, layers=LAYERS, name=mechanism)
                eval_batch = task.sample(mode.budget.eval_size, torch.Generator().manual_seed(seed + _EVAL_SEED))
                trained = fit(model, task, ClassifyObjective(), mode.budget,
                              generator=torch.Generator().manual_seed(seed), eval_batch=eval_batch, evals=mode.evals,
                              progress=progress)
                test = task.sample(mode.budget.test_size, torch.Generator().manual_seed(seed + _TEST_SEED))
                accuracy = evaluate(model, ClassifyObjective(), test, task)
            high = _resident("VmHWM")
            if base is not None and high is not None:
                peak = max(peak or 0, high - base)
            result = Result(key_of(task_name, mechanism), task_name, mechanism, seed, accuracy, trained.seconds, peak,
                            count_parameters(model), trained.curve,
                            extra={"steps_per_second": mode.budget.steps / trained.seconds, "length": sizes.length})
            results.append(result)
            if progress is not None:
                progress(f"seed {seed}: test {accuracy:.3f}")
            if emit is not None:
                emit(result)
    finally:
        torch.set_num_threads(threads)
    return results
