"""The tour's training loop and its record: :class:`Budget`, :class:`Objective`, :func:`fit`, :class:`Result`.

One loop trains every experiment: AdamW with a linear warm-up then cosine decay,
gradient clipping, fresh batches drawn from the task with a seeded generator, and an
evaluation on a fixed held-out batch at ``evals`` evenly spaced points (the learning
curve). What differs between task kinds (the loss, the metric, the attention maps
worth showing) is an :class:`Objective`. Nothing here reads the global RNG except the
model's own initialisation and dropout, which :func:`attnkit.lab.tour.run` seeds.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields

import torch
from torch import nn

from ....errors import ArgumentError, check_int
from ...analysis import memory
from ...analysis.recorder import AttentionRecorder
from ...analysis.timing import synchronizer
from ...tasks import Task

__all__ = ["Budget", "Objective", "Fit", "Result", "fit", "evaluate", "count_parameters", "tensors_to_lists",
           "recorded", "on_device", "PeakMemory"]

Progress = Callable[[str], None] | None


@dataclass(frozen=True)
class Budget:
    """How long and how hard to train: steps, batch size, peak learning rate and the evaluation sizes."""

    steps: int
    batch_size: int = 64
    lr: float = 1e-3
    warmup: float = 0.1
    weight_decay: float = 0.0
    clip: float = 1.0
    eval_size: int = 256
    test_size: int = 1000

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_size", "test_size"):
            check_int("Budget", name, getattr(self, name), 1)
        if not (self.lr > 0 and 0 <= self.warmup < 1 and self.weight_decay >= 0 and self.clip > 0):
            raise ArgumentError(f"Budget: need lr > 0, 0 <= warmup < 1, weight_decay >= 0, clip > 0; got {self}")


class Objective:
    """What a task kind trains on and how it is scored; subclasses override :meth:`loss` and :meth:`score`.

    :meth:`examples` returns attention maps of the trained model on real test examples
    (``[{"title", "maps": {name: (H, Lq, Lk)}, "q_tokens", "k_tokens"}]``) and :meth:`extra`
    any further measurements (``{name: float}``); both default to nothing.
    """

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor], task: Task) -> torch.Tensor:
        raise NotImplementedError

    def score(self, model: nn.Module, batch: dict[str, torch.Tensor], task: Task) -> float:
        raise NotImplementedError

    def examples(self, model: nn.Module, batch: dict[str, torch.Tensor], task: Task) -> list[dict]:
        return []

    def extra(self, model: nn.Module, batch: dict[str, torch.Tensor], task: Task) -> dict[str, float]:
        return {}


@dataclass
class Fit:
    """What :func:`fit` measured: the curve ``(step, train_loss, eval_accuracy)``, seconds and peak bytes."""

    curve: list[tuple[int, float, float]]
    seconds: float
    peak_bytes: int | None


@contextlib.contextmanager
def recorded(model: nn.Module) -> Iterator[AttentionRecorder]:
    """An :class:`AttentionRecorder` on ``model`` under ``no_grad``, quiet when the model reports no map
    (a mechanism that never forms its weights, or a baseline without attention)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="AttentionRecorder: no attention map", category=RuntimeWarning)
        with torch.no_grad(), AttentionRecorder(model) as rec:
            yield rec


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters (shared tensors counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values())


def _schedule(budget: Budget) -> Callable[[int], float]:
    warm = max(1, round(budget.warmup * budget.steps))

    def factor(step: int) -> float:  # linear warm-up, then cosine decay to 10 % of the peak
        if step < warm:
            return (step + 1) / warm
        done = (step - warm) / max(1, budget.steps - warm)
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, done)))
    return factor


def on_device(batch: dict[str, torch.Tensor], device: torch.device | str) -> dict[str, torch.Tensor]:
    """``batch`` with every tensor moved to ``device`` (the tasks draw their batches on the CPU)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


@torch.no_grad()
def evaluate(model: nn.Module, objective: Objective, batch: dict[str, torch.Tensor], task: Task) -> float:
    """The objective's score of ``model`` in eval mode on ``batch`` (the model's mode is restored).

    The batch is moved to the device of the model's parameters first.
    """
    was = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        return float(objective.score(model, on_device(batch, device), task))
    finally:
        model.train(was)


class PeakMemory:
    """The peak memory a block of work adds: resident size on the CPU (Linux), allocated bytes on CUDA.

    ``start()`` before the work, ``bytes()`` after it (None where it cannot be measured: not Linux).
    On the CPU it is the growth of the process's high-water mark (VmHWM, reset at ``start``) over
    its resident size then, so memory that the process freed earlier and the work reuses is not
    counted: only a process that has done nothing else before measures the work alone.
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.base: int | None = None

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return
        try:
            memory.reset_peak()
            self.base = memory.resident_bytes("VmRSS")
        except (OSError, RuntimeError):  # not Linux: no peak measurement
            self.base = None

    def bytes(self) -> int | None:
        if self.base is None:
            return None
        if self.device.type == "cuda":
            return max(0, torch.cuda.max_memory_allocated(self.device) - self.base)
        try:
            return max(0, memory.resident_bytes("VmHWM") - self.base)
        except (OSError, RuntimeError):
            return None


def fit(model: nn.Module, task: Task, objective: Objective, budget: Budget, *, generator: torch.Generator,
        eval_batch: dict[str, torch.Tensor], evals: int = 10, progress: Progress = None,
        device: torch.device | str = "cpu") -> Fit:
    """Train ``model`` on fresh batches of ``task`` for ``budget.steps`` steps; return the curve and the cost.

    The train loss in the curve is the mean over the steps since the previous point; the
    eval accuracy is :func:`evaluate` on ``eval_batch``. ``progress(label)`` is called once
    per curve point. Seconds count the training steps only (not the evaluations, not drawing
    the batches). ``device``: the model is moved there and each batch is moved there as it is drawn.
    """
    check_int("fit", "evals", evals, 1)
    device = torch.device(device)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=budget.lr, weight_decay=budget.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(budget))
    points = sorted({max(1, round(budget.steps * (i + 1) / evals)) for i in range(evals)})
    curve, losses, seconds = [], [], 0.0
    model.train()
    peak = PeakMemory(device)
    peak.start()
    sync = synchronizer(device) or (lambda: None)  # CUDA kernels run asynchronously: wait before reading the clock
    for step in range(1, budget.steps + 1):
        batch = on_device(task.sample(budget.batch_size, generator), device)
        sync()
        start = time.perf_counter()
        loss = objective.loss(model, batch, task)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), budget.clip)
        opt.step()
        sched.step()
        sync()
        seconds += time.perf_counter() - start
        losses.append(float(loss.detach()))
        if step in points:
            acc = evaluate(model, objective, eval_batch, task)
            curve.append((step, sum(losses) / len(losses), acc))
            losses = []
            if progress is not None:
                progress(f"step {step}: loss {curve[-1][1]:.3f}, eval {acc:.3f}")
    model.eval()
    return Fit(curve, seconds, peak.bytes())


def tensors_to_lists(value):
    """``value`` with every tensor replaced by nested lists (recursively through dicts, lists and tuples)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, dict):
        return {k: tensors_to_lists(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [tensors_to_lists(v) for v in value]
    return value


@dataclass
class Result:
    """One trained run: the test metric, its cost, the learning curve, attention maps and extra measurements.

    ``accuracy`` is the task's test metric in [0, 1]; ``train_seconds`` the time of the
    training steps; ``peak_bytes`` the peak resident memory that training added (None off
    Linux); ``curve`` holds ``(step, train_loss, eval_accuracy)``; each of ``examples`` is
    ``{"title", "maps": {name: Tensor (H, Lq, Lk)}, "q_tokens", "k_tokens"}``; ``extra``
    maps names to floats. :meth:`to_json` gives plain JSON data (tensors as nested lists) and
    :meth:`from_json` reads it (or its text) back with the maps as float32 tensors.

    Example:
        >>> import torch
        >>> maps = {"layer 0": torch.eye(2)[None]}
        >>> r = Result("t/m", "t", "m", 0, 0.5, 1.0, None, 10, [(1, 2.0, 0.5)], [{"title": "x", "maps": maps}])
        >>> back = Result.from_json(json.dumps(r.to_json()))
        >>> back.curve, back.examples[0]["maps"]["layer 0"].shape
        ([(1, 2.0, 0.5)], torch.Size([1, 2, 2]))
    """

    key: str
    task: str
    mechanism: str
    seed: int
    accuracy: float
    train_seconds: float
    peak_bytes: int | None
    parameters: int
    curve: list[tuple[int, float, float]] = field(default_factory=list)
    examples: list[dict] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict:
        """A dict of JSON values (lists, numbers, strings, None)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["examples"] = tensors_to_lists(self.examples)
        data["curve"] = [list(point) for point in self.curve]
        data["extra"] = dict(self.extra)
        return data

    @classmethod
    def from_json(cls, data: dict | str) -> Result:
        """The :class:`Result` of :meth:`to_json`'s output, or of its ``json.dumps`` text."""
        if isinstance(data, str):
            data = json.loads(data)
        if not isinstance(data, dict):
            raise ArgumentError(f"Result.from_json: data must be a dict or JSON text of one; got {type(data).__name__}")
        missing = sorted({"key", "task", "mechanism", "seed", "accuracy"} - data.keys())
        if missing:
            raise ArgumentError(f"Result.from_json: data lacks {missing}")
        examples = [{**ex, "maps": {name: torch.tensor(w, dtype=torch.float32) for name, w in ex["maps"].items()}}
                    for ex in data.get("examples") or []]
        curve = [tuple(point) for point in data.get("curve") or []]
        known = {k: data.get(k) for k in ("train_seconds", "peak_bytes", "parameters")}
        return cls(data["key"], data["task"], data["mechanism"], data["seed"], data["accuracy"], **known,
                   curve=curve, examples=examples, extra=dict(data.get("extra") or {}))
