"""The MAD battery: every causal token-mixing mechanism of the library on MAD's six tasks, one table.

Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid Architectures" (ICML 2024, arXiv:2403.17844),
Sec. 3-4: in-context, fuzzy and noisy recall, selective copying, compression and memorization
(:data:`attnkit.lab.tasks.mad.MAD_TASKS`, the paper's easiest setting of each) score a mechanism in
a 2-layer model, and the mean over the tasks predicts how it scales (their Fig. 1). Here each
mechanism of :data:`MECHANISMS` is the token mixer of the same 2-layer causal pre-norm language model
(:func:`~.tokens.language_model`, width 64, 2 heads) with the same budget on a task; the hybrids alternate a
recurrent layer with a softmax layer (``TransformerLM(softmax_every=2)``). The report's
section (:mod:`attnkit.lab.tour.report.mad`) draws the task x mechanism table with the mean and checks
:data:`CLAIM`.

The budget fits a CPU: one seed (:func:`default_seeds`; three on a GPU, ``--seeds 0 1 2`` anywhere) and few
sequences. Softmax attention learns in-context recall in a jump, when an induction head forms: on seed 0 (rotary
positions, learning rate 3e-3, a busy 2-core machine) it was at 30 % (guessing among the values in context) up to
step 300 of 500 at batch 32 and at 100 % from step 400; at batch 64 it was still at 51 % at step 300 of 300 (seed 1:
97 % from step 160); at batch 16 it was at 30 % after 400 steps. So in-context recall, the claim's task, trains 500
steps of 32 (:data:`BUDGETS`), and the other five tasks 90 steps of 16 (:data:`BUDGET`): a short budget, whose
columns show early learning, not the paper's trained scores. The cost per sequence is about the same at batches 16,
32 and 64 (measured at one thread). A training step at batch 64, one thread of a quiet 2-core CPU (2026-12-07), took
0.14-0.31 s for softmax, the window, linear attention, the Performer, RetNet, GLA, Mamba-2 and DeltaNet at length
128, 0.35-0.6 s for Gated DeltaNet, KDA and the hybrids, 0.6-1.4 s for every mechanism at length 256 (selective
copying), and 0.08-0.4 s at lengths 32 and 65; the twelve runs of in-context recall then take about 870 s of one
thread, the 60 others about 580 s, and the 72 processes' start-up and evaluations about 460 s: about 16 minutes on
two workers.
Experiment keys are ``<task>/<mechanism>`` (:data:`KEYS`): ``attnkit tour --suite mad``.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Protocol, TypedDict, runtime_checkable

from .... import masks
from ....models import TransformerLM
from ... import tasks
from ...tasks.mad import MAD_TASKS
from . import Built, Experiment
from .tokens import TokenObjective
from .train import Budget

__all__ = ["MECHANISMS", "USES", "CLAIM", "WINDOW", "BUDGET", "BUDGETS", "QUICK", "default_seeds", "mad_experiments",
           "KEYS"]

WINDOW = 16
DIM, HEADS, LAYERS = 64, 2, 2

_ROPE, _NOPE, _SINE = {"positional": "rotary"}, {"positional": None}, {"positional": "sinusoidal"}

# name -> (the attention of the model, further TransformerLM options, what it is). Positions as each family's papers
# use them: rotary for softmax layers, none for the recurrences (their order is in the recurrence), sinusoidal for
# linear attention and the Performer (which have no rotary form here).
MECHANISMS: dict[str, tuple[str, dict[str, Any], str]] = {
    "softmax": ("softmax", _ROPE, "softmax attention (Vaswani et al. 2017), rotary positions"),
    "window": ("softmax", {**_ROPE, "attention_mask": masks.sliding_window(WINDOW, 0)},
               f"softmax attention over the last {WINDOW} tokens (a sliding window), rotary positions"),
    "linear": ("linear-attention", _SINE, "linear attention (Katharopoulos et al. 2020)"),
    "performer": ("performer", _SINE, "Performer's random features (Choromanski et al. 2021)"),
    "retnet": ("retnet", _NOPE, "RetNet's retention (Sun et al. 2023): a fixed decay per head"),
    "gla": ("gla", _NOPE, "gated linear attention (Yang et al. 2023)"),
    "mamba2": ("mamba2", _NOPE, "Mamba-2's mixer (Dao & Gu 2024)"),
    "deltanet": ("deltanet", _NOPE, "DeltaNet (Yang et al. 2024): the delta rule"),
    "gated-deltanet": ("gated-deltanet", _NOPE, "Gated DeltaNet (Yang et al. 2024)"),
    "kda": ("kimi-delta-attention", _NOPE, "Kimi Delta Attention (Kimi Linear 2025): a gate per channel"),
    "hybrid-gdn": ("gated-deltanet", {**_ROPE, "softmax_every": 2},
                   "hybrid: a Gated DeltaNet layer then a softmax layer (Qwen3-Next's mix, in small)"),
    "hybrid-mamba2": ("mamba2", {**_ROPE, "softmax_every": 2},
                      "hybrid: a Mamba-2 layer then a softmax layer (as Jamba)"),
}
_SOFTMAX = ("multi-head", "scaled-dot-product", "rotary-embedding")
USES = {"softmax": _SOFTMAX, "window": (*_SOFTMAX, "sliding-window"),
        "linear": ("linear-attention", "sinusoidal-positional-encoding"),
        "performer": ("performer", "sinusoidal-positional-encoding"), "retnet": ("retnet",), "gla": ("gla",),
        "mamba2": ("mamba2",),
        "deltanet": ("deltanet",), "gated-deltanet": ("gated-deltanet",), "kda": ("kimi-delta-attention",),
        "hybrid-gdn": ("gated-deltanet", *_SOFTMAX), "hybrid-mamba2": ("mamba2", *_SOFTMAX)}
class MADClaim(TypedDict):
    """The claim the MAD experiment tests: its text and source, the task, the mechanism and the accuracy it
    reaches."""

    statement: str
    source: str
    task: str
    mechanism: str
    level: float


@runtime_checkable
class _TokenTask(Protocol):
    """The sizes the language model is built for, which every MAD task has."""

    seq_len: int

    @property
    def vocab_size(self) -> int: ...


CLAIM: MADClaim = {
    "statement": "softmax attention reaches at least 90 % on in-context recall at MAD's easiest setting "
                 "(vocabulary 16, length 128)",
    "source": "Poli et al. 2024, arXiv:2403.17844, Sec. 4.1 (attention solves the recall tasks)",
    "task": "in_context_recall", "mechanism": "softmax", "level": 0.9}


def _build(task: str, mechanism: str) -> Built:
    data = tasks.get(task)
    assert isinstance(data, _TokenTask)  # every MAD task is a token task with these sizes
    attention, options, _ = MECHANISMS[mechanism]
    model = TransformerLM(data.vocab_size, dim=DIM, num_heads=HEADS, num_layers=LAYERS, causal=True, dropout=0.0,
                          norm_first=True, attention=attention, max_len=data.seq_len, **options)
    return Built(model, data, data, TokenObjective())


BUDGET = Budget(steps=90, batch_size=16, lr=3e-3, eval_size=64, test_size=256)
"""The budget of every MAD run but in-context recall's (:data:`BUDGETS`): 1440 sequences, sized so that the 72 runs
of one seed fit about 16 minutes of a quiet 2-core CPU (see the module docstring)."""
BUDGETS = {CLAIM["task"]: Budget(steps=500, batch_size=32, lr=3e-3, eval_size=64, test_size=256)}
"""Task -> its budget where it is not :data:`BUDGET`: in-context recall, the claim's task, trains on 16000
sequences, since softmax attention learns it in a jump (an induction head forms) only after 10000-20000."""
QUICK = Budget(steps=30, batch_size=16, lr=3e-3, eval_size=64, test_size=128)
"""``--quick``: a smoke run of the suite, every task."""


def default_seeds(device: str) -> tuple[int, ...]:
    """The suite's seeds when none are given: one on a CPU (the 20-minute budget), three elsewhere (Welch's t)."""
    return (0,) if str(device).split(":")[0] == "cpu" else (0, 1, 2)


def mad_experiments() -> list[Experiment]:
    """One experiment per MAD task and mechanism (:data:`KEYS`), one budget per task (:data:`BUDGET`,
    :data:`BUDGETS`) for every mechanism."""
    return [Experiment(task, name, f"MAD {task} ({tasks.get(task).describe()}); 2-layer causal "
                       f"pre-norm LM, width {DIM}: {text}", partial(_build, task, name), BUDGETS.get(task, BUDGET),
                       QUICK,
                       uses=("causal", *USES[name]))
            for task in MAD_TASKS for name, (_, _, text) in MECHANISMS.items()]


KEYS = tuple(f"{task}/{name}" for task in MAD_TASKS for name in MECHANISMS)
