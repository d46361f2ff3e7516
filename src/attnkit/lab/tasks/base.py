"""The task contract: one small base class, a registry by name, argument checks and the metrics.

Every task is a frozen dataclass whose fields are its sizes. ``sample(n, generator)``
returns a ``dict[str, Tensor]`` that always holds ``"inputs"`` and ``"targets"``
(plus task-specific keys); ``accuracy(prediction, batch)`` scores a prediction laid
out like ``batch["targets"]``. Everything is drawn from the ``torch.Generator``
passed in (the global generator when ``None``), so one seed gives bitwise the same
batch on every run.
"""

from __future__ import annotations

import random
from typing import ClassVar

import torch

from ...errors import ArgumentError, DTypeError, ShapeError, check_int

__all__ = ["IGNORE_INDEX", "KINDS", "Task", "register", "get", "names", "check_float", "python_rng"]

IGNORE_INDEX = -100
"""Target value at positions that are not scored (as ``torch.nn.CrossEntropyLoss``'s default)."""

KINDS = ("tokens", "classify", "seq2seq", "pointer", "image")

_TASKS: dict[str, type[Task]] = {}


class Task:
    """Base of every generated learning task.

    Class attributes: ``name`` (registry key) and ``kind``, one of

    - ``"tokens"``: ``inputs (n, L)`` long ids ``< vocab_size``; ``targets (n, L)`` per-position
      labels ``< num_classes``, ``IGNORE_INDEX`` (-100) where nothing is scored.
      Metric: accuracy over the scored positions of the whole batch.
    - ``"classify"``: ``targets (n,)``, one label ``< num_classes`` per example. Metric: accuracy.
    - ``"seq2seq"``: ``inputs (n, Ls)`` source ids (text, EOS, PAD), ``decoder_inputs (n, Lt)``
      (BOS, text, EOS, PAD), ``targets (n, Lt)`` = ``decoder_inputs`` shifted left (text, EOS,
      then -100). Metric: exact match per sequence (all scored positions right).
    - ``"pointer"``: ``inputs (n, N, d)`` float points; ``targets (n, T)`` indices into the
      points, -100 after the end. Metric: exact match per sequence.
    - ``"image"``: ``inputs (n, C, H, W)`` float; ``targets (n,)``. Metric: accuracy.

    ``needs_causal_model`` marks tasks whose inputs show later targets (a bidirectional model
    would copy them). Subclasses define ``_sample(n, generator)`` and ``describe()``, and set
    ``num_classes``.
    """

    name: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    needs_causal_model: ClassVar[bool] = False
    """True when ``inputs`` hold later answers (next-token prediction: ``inputs[:, t + 1]`` is
    ``targets[:, t]``), so that only a causal model learns the task rather than copying."""

    @property
    def num_classes(self) -> int:
        """Number of distinct target values (the size of a model's output layer)."""
        raise NotImplementedError

    def sample(self, n: int, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """``n`` fresh examples drawn from ``generator`` (the global RNG when None)."""
        check_int(f"{type(self).__name__}.sample", "n", n, 1)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ArgumentError(f"{type(self).__name__}.sample: generator must be a torch.Generator or None; "
                                f"got {type(generator).__name__}")
        if generator is not None and generator.device.type != "cpu":
            raise ArgumentError(f"{type(self).__name__}.sample: generator must be a CPU generator; "
                                f"got device {generator.device}")
        return self._sample(n, generator)

    def _sample(self, n: int, generator: torch.Generator | None) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def question_positions(self, inputs: torch.Tensor) -> torch.Tensor | None:
        """Where the task asks its questions, read from ``inputs`` alone (never from the targets): a bool
        ``(n, length)`` tensor (True = a question token), or None when the task marks none.

        A model with global tokens (Longformer, Beltagy et al. 2020, Sec. 3.1) puts them there, as the
        paper puts them on a question's tokens; None leaves it to the model (a class token).
        """
        return None

    def accuracy(self, prediction: torch.Tensor, batch: dict[str, torch.Tensor]) -> float:
        """The task's metric in [0, 1]; ``prediction`` is the argmax output, shaped like ``batch["targets"]``."""
        who = f"{type(self).__name__}.accuracy"
        if not isinstance(batch, dict) or "targets" not in batch:
            raise ArgumentError(f"{who}: batch must be a dict from sample() holding 'targets'; "
                                f"got {type(batch).__name__}")
        targets = batch["targets"]
        if not isinstance(prediction, torch.Tensor):
            raise DTypeError(f"{who}: prediction must be a tensor; got {type(prediction).__name__}")
        if prediction.is_floating_point() or prediction.is_complex() or prediction.dtype == torch.bool:
            raise DTypeError(f"{who}: prediction must hold integer class ids (the argmax); got {prediction.dtype}")
        if prediction.shape != targets.shape:
            raise ShapeError(f"{who}: prediction must have the shape of batch['targets'] {tuple(targets.shape)} "
                             f"(take the argmax over classes); got {tuple(prediction.shape)}")
        prediction = prediction.to(targets.device)
        if self.kind in ("classify", "image"):
            return (prediction == targets).double().mean().item()
        scored = targets != IGNORE_INDEX
        hit = (prediction == targets) | ~scored
        if self.kind == "tokens":
            total = int(scored.sum())
            if total == 0:
                raise ArgumentError(f"{who}: batch['targets'] has no scored position (all {IGNORE_INDEX})")
            return ((prediction == targets) & scored).sum().item() / total
        return hit.flatten(1).all(1).double().mean().item()

    def describe(self) -> str:
        """One line for a report: name, sizes, kind and metric."""
        raise NotImplementedError


def register(cls: type[Task]) -> type[Task]:
    """Class decorator: add a task class under ``cls.name``."""
    if cls.kind not in KINDS:
        raise ValueError(f"task {cls.__name__}: kind must be one of {KINDS}; got {cls.kind!r}")
    if cls.name in _TASKS and _TASKS[cls.name] is not cls:
        raise ValueError(f"task name {cls.name!r} is already taken by {_TASKS[cls.name].__name__}")
    _TASKS[cls.name] = cls
    return cls


def get(name: str, **sizes) -> Task:
    """The task called ``name``, built with ``sizes`` as constructor keywords (defaults otherwise)."""
    if name not in _TASKS:
        raise ArgumentError(f"tasks.get: name must be one of {names()}; got {name!r}")
    return _TASKS[name](**sizes)


def names() -> list[str]:
    """Registered task names, sorted."""
    return sorted(_TASKS)


def check_float(who: str, name: str, value, low: float, high: float, *, high_open: bool = False) -> float:
    """``value`` as a float in ``[low, high]`` (``[low, high)`` if ``high_open``), else an ArgumentError naming it."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high
    if ok and high_open and value == high:
        ok = False
    if not ok:
        bound = f"[{low}, {high})" if high_open else f"[{low}, {high}]"
        raise ArgumentError(f"{who}: {name} must be a number in {bound}; got {value!r}")
    return float(value)


def python_rng(generator: torch.Generator | None) -> random.Random:
    """A ``random.Random`` seeded by one draw from ``generator``, for per-example Python logic."""
    seed = torch.randint(0, 2**62, (1,), generator=generator).item()
    return random.Random(seed)
