"""The long-range suite's plans: at each scale, which tasks run, at what sizes, with which model, budget,
mechanisms and seeds.

Three scales (:data:`SCALES`), each its own folder of saved runs:

- ``default``: what a 2-core CPU teaches in about 20 minutes (two single-thread runs at once).
  Three tasks a small model learns in a few hundred steps, each a stand-in for a Long Range Arena
  task (Tay et al. 2020, arXiv:2011.04006): :class:`~attnkit.lab.tasks.AssociativeRecall` at 2048
  tokens (retrieval), :class:`~attnkit.lab.tasks.ByteContext` at 1024 bytes (text) and
  :class:`~attnkit.lab.tasks.PixelLegend` at 24 x 24 pixels (image). Each is labelled at many positions
  per sequence and states its evidence many times, which is what lets attention leave its initial
  uniform state within a CPU budget (a single label per sequence, as in LRA, teaches these
  models nothing in a few hundred steps). The mechanisms the accuracy claims compare
  (:mod:`.claims`) run on the associative recall, every mechanism but NSA and MoBA on the other
  two, three seeds each; the claims read the two retrieval-style tasks, the recall and the legend
  (the claim on data-chosen blocks reads the recall alone).
- ``quick``: the same tasks at toy sizes and a few steps, each mechanism on one of them, one seed:
  it checks that everything runs.
- ``lra``: Long Range Arena's own five tasks at its lengths (ListOps 2000, text and retrieval 4000,
  image and Pathfinder 32 x 32), with the model sizes and step counts of its configurations, plus
  the associative recall at 4096, for one GPU (``--device cuda``; :mod:`.estimate` gives its time).

NSA and MoBA (:data:`CHOSEN_BLOCKS`) train on the associative recall alone, at every scale: it is
the task their claim reads (every fact lies beyond the sliding window's reach), and their selected
key blocks run on attnkit's gathered path at several times dense softmax's time per training step
at the default scale, beyond what its FLOP estimate (:mod:`.estimate`) shows: on the other tasks
they would lengthen the default scale further for no claim.

The comparison is at equal parameters (:func:`.model.build`) and equal training (steps, batch,
learning rate) per task.
"""

from __future__ import annotations

from dataclasses import dataclass

from ....errors import ArgumentError, did_you_mean
from ... import tasks
from ...tasks import Task
from ..experiments.train import Budget
from .roster import MECHANISMS, Sizes

__all__ = ["SuiteTask", "ModelSize", "Setup", "Plan", "TASKS", "SCALES", "SEEDS", "CLAIMED", "CHOSEN_BLOCKS", "plan",
           "suite_task", "sizes_of"]

SEEDS = (0, 1, 2)
SCALES = ("default", "quick", "lra")
CLAIMED = ("softmax", "longformer", "bigbird", "local", "sliding-window", "linformer", "linear", "performer", "nsa",
           "moba")
"""The mechanisms the accuracy claims compare (:mod:`.claims`): the associative recall runs these, at every scale."""
CHOSEN_BLOCKS = tuple(name for name, m in MECHANISMS.items() if m.chosen_blocks)
"""NSA and MoBA: trained on the associative recall alone (module docstring)."""


@dataclass(frozen=True)
class SuiteTask:
    """A task of the suite: its registered name, what it tests, and what the claims need to know.

    ``retrieval``: the answer needs exact recall of distant content (the claims' "retrieval-style"
    tasks); ``image``: a flattened image with a ``side`` (the Lambda layer runs there only).
    """

    name: str
    purpose: str
    retrieval: bool = False
    image: bool = False


TASKS: dict[str, SuiteTask] = {t.name: t for t in [
    SuiteTask("associative_recall", "retrieval: answer many queries with the values that facts stated at least a "
              "quarter of the sequence earlier gave their keys (Zoology's MQAR, RULER's multi-key needle)",
              retrieval=True),
    SuiteTask("byte_context", "text: label every mark of a byte document by its stance, which the document's "
              "header, far away, decides (LRA Text: bytes whose meaning rests on distant text)"),
    SuiteTask("pixel_legend", "image: segment the objects of a pixel sequence by the classes a legend at the top "
              "gives their colours (LRA Image: a flat sequence of pixels, no 2-D prior)", retrieval=True, image=True),
    SuiteTask("long_listops", "hierarchical reasoning over a long nested expression (LRA ListOps)"),
    SuiteTask("byte_text", "byte-level document classification whose label rests on distant evidence (LRA Text)"),
    SuiteTask("byte_retrieval", "are two byte documents about the same thing: matching across the whole sequence "
              "(LRA Retrieval)", retrieval=True),
    SuiteTask("pixel_images", "image classification from a flat sequence of pixels (LRA Image)", image=True),
    SuiteTask("pathfinder", "are two marked points joined by a path: long-range spatial dependency (LRA Pathfinder)",
              image=True),
]}


@dataclass(frozen=True)
class ModelSize:
    """The encoder: width, heads, blocks, and dense softmax's feed-forward width (the others are matched to it)."""

    dim: int
    heads: int
    layers: int
    ff: int


@dataclass(frozen=True)
class Setup:
    """How one task runs at one scale: the task's sizes, the model, the training budget, the mechanisms, the seeds."""

    task: str
    sizes: tuple[tuple[str, int], ...]
    model: ModelSize
    budget: Budget
    mechanisms: tuple[str, ...]
    seeds: tuple[int, ...] = SEEDS

    def make(self) -> Task:
        """The task at these sizes."""
        return tasks.get(self.task, **dict(self.sizes))


def sizes_of(setup: Setup, task: Task) -> Sizes:
    """The roster :class:`Sizes` of a built task (its ``length`` and, for images, its ``side``)."""
    side = int(task.side) if TASKS[setup.task].image else None
    return Sizes(int(task.length), setup.model.dim, setup.model.heads, side)


@dataclass(frozen=True)
class Plan:
    """One scale of the suite: its setups, curve points per run, and the speed measurement's length and model."""

    scale: str
    setups: tuple[Setup, ...]
    evals: int
    speed_length: int
    speed_model: ModelSize
    speed_batch: int = 4

    def setup(self, task: str) -> Setup:
        """The setup of ``task`` (an ArgumentError naming the plan's tasks when it has none)."""
        for s in self.setups:
            if s.task == task:
                return s
        raise ArgumentError(f"long suite ({self.scale}): no task {task!r}; {did_you_mean(task, self.tasks)}"
                            f"known: {', '.join(self.tasks)}")

    @property
    def tasks(self) -> list[str]:
        return [s.task for s in self.setups]

    @property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        """Every (task, mechanism) the plan trains, task by task."""
        return tuple((s.task, m) for s in self.setups for m in s.mechanisms)

    @property
    def seeds(self) -> tuple[int, ...]:
        """Every seed some setup uses."""
        return tuple(sorted({seed for s in self.setups for seed in s.seeds}))


def _every(image: bool) -> tuple[str, ...]:
    """Every mechanism that runs on a task of this kind, but those trained on the associative recall alone."""
    return tuple(m for m in MECHANISMS if (image or not MECHANISMS[m].images_only) and m not in CHOSEN_BLOCKS)


_SMALL = ModelSize(dim=32, heads=2, layers=1, ff=128)


def _default() -> Plan:
    # Warm-up then cosine to 10 % of a high peak rate (1e-2): at 3e-3 the recall tasks stay on their plateau.
    fast = {"lr": 1e-2, "warmup": 0.1}
    return Plan("default", (
        Setup("associative_recall", (("length", 2048), ("num_keys", 4), ("repeats", 64), ("queries", 16)), _SMALL,
              Budget(steps=150, batch_size=4, eval_size=4, test_size=64, **fast), CLAIMED),
        Setup("byte_context", (("length", 1024),), _SMALL,
              Budget(steps=60, batch_size=8, eval_size=8, test_size=128, **fast), _every(False)),
        Setup("pixel_legend", (("side", 24),), _SMALL,
              Budget(steps=300, batch_size=8, eval_size=8, test_size=128, **fast), _every(True)),
    ), evals=3, speed_length=2048, speed_model=_SMALL)


def _quick() -> Plan:
    # Every mechanism once (a process start is most of a toy run's time): the claims' on the retrieval task,
    # the others on text, Lambda on the image; dense softmax on each.
    budget = Budget(steps=4, batch_size=4, lr=1e-2, warmup=0.25, eval_size=4, test_size=8)
    rest = tuple(m for m in _every(False) if m not in CLAIMED)
    return Plan("quick", (
        Setup("associative_recall", (("length", 128), ("num_keys", 4), ("repeats", 4), ("queries", 4)), _SMALL, budget,
              CLAIMED, (0,)),
        Setup("byte_context", (("length", 128), ("marks", 8)), _SMALL, budget, ("softmax", *rest), (0,)),
        Setup("pixel_legend", (("side", 16), ("objects", 3)), _SMALL, budget, ("softmax", "lambda"), (0,)),
    ), evals=2, speed_length=256, speed_model=_SMALL)


def _lra() -> Plan:
    # Tay et al. 2020's configurations (lra_benchmarks/*/configs): width, heads, blocks, MLP width, batch, steps.
    def budget(steps, batch, lr, warmup):
        return Budget(steps=steps, batch_size=batch, lr=lr, warmup=warmup, weight_decay=0.1 if lr >= 1e-3 else 0.0,
                      eval_size=batch, test_size=max(2048, batch))
    text = ModelSize(256, 4, 4, 1024)
    match = ModelSize(128, 4, 4, 512)
    return Plan("lra", (
        Setup("long_listops", (("length", 2000),), ModelSize(512, 8, 6, 2048), budget(5000, 32, 1e-3, 0.2),
              _every(False), (0,)),
        Setup("byte_text", (("length", 4000),), text, budget(20000, 32, 1e-3, 0.2), _every(False), (0,)),
        Setup("byte_retrieval", (("length", 4000),), match, budget(5000, 32, 1e-3, 0.2), _every(False), (0,)),
        Setup("pixel_images", (("side", 32),), ModelSize(32, 1, 1, 64), budget(35000, 256, 5e-4, 0.005),
              _every(True), (0,)),
        Setup("pathfinder", (("side", 32),), ModelSize(32, 2, 1, 32), budget(62400, 512, 1e-3, 0.005),
              _every(True), (0,)),
        Setup("associative_recall", (("length", 4096), ("num_keys", 4), ("repeats", 128), ("queries", 32)), match,
              budget(5000, 32, 1e-3, 0.1), CLAIMED),
    ), evals=10, speed_length=4096, speed_model=match, speed_batch=8)


_PLANS = {"default": _default, "quick": _quick, "lra": _lra}


def plan(scale: str = "default") -> Plan:
    """The plan of ``scale`` (one of :data:`SCALES`)."""
    if scale not in _PLANS:
        raise ArgumentError(f"long suite: unknown scale {scale!r}; {did_you_mean(scale, SCALES)}"
                            f"known: {', '.join(SCALES)}")
    return _PLANS[scale]()


def suite_task(name: str) -> SuiteTask:
    """The suite task called ``name``."""
    if name not in TASKS:
        raise ArgumentError(f"long suite: unknown task {name!r}; {did_you_mean(name, TASKS)}known: {', '.join(TASKS)}")
    return TASKS[name]
