"""State tracking against test length: parity, counting modulo 3 and the S3 / A5 word problems, trained short and
tested long.

Grazzi et al. 2025, "Unlocking State-Tracking in Linear RNNs Through Negative Eigenvalues" (ICLR 2025,
arXiv:2411.12537), Sec. 5.1 and Table 2: trained on sequences of length up to 40 and tested on lengths
up to 256, a DeltaNet whose ``beta`` lies in [0, 2] (its transition ``I - beta k k^T`` then has the
eigenvalue ``1 - beta`` in [-1, 1]) solves parity, while with ``beta`` in [0, 1] (eigenvalues in
[0, 1]) it stays at chance; Mamba-2 with positive decays stays at chance too, and an LSTM solves it.
Softmax attention, with positions or without, fits the training lengths and fails beyond them
(Deletang et al. 2023, arXiv:2207.02098). Every mechanism here trains the same one-layer causal
pre-norm model of width :data:`WIDTH` (one head) on length :data:`TRAIN_LENGTH`, and is tested on
length ``4 x TRAIN_LENGTH`` with only the positions past the training length scored (the states after
41 to 160 tokens): the run's accuracy. :class:`StateObjective` adds the accuracy at each band of test
lengths up to :data:`LONGEST` (``length_<L>``: the states after ``L_prev + 1 .. L`` tokens), which the
report (:mod:`attnkit.lab.tour.report.state`) draws against length, and where it decides :data:`CLAIM`.

``deltanet-neg`` asks :class:`~attnkit.nn.DeltaNet` for ``allow_neg_eigval=True`` (``beta = 2 sigmoid``); it is
an experiment only where DeltaNet has that option (:data:`NEGATIVE_BETA`), and the report's claim says so
where it is missing.

The budget (250 steps of 64 sequences, learning rate 3e-3) was set on seed 0 on a busy 2-core machine:
a one-layer DeltaNet with ``beta`` in [0, 2] reaches 97 % at 4x the training length in 200 steps
(about 30 s), one with ``beta`` in [0, 1] stays at 50 %. Parity trains longer and harder (:data:`BUDGETS`:
500 steps at 9e-3): at 250 steps and 3e-3 seeds 1 and 2 of ``beta`` in [0, 2] fitted the training length
but reached only 68 % and 85 % at 41-160 tokens; at 500 steps and 9e-3 they reached 98 % and 99.8 %, seed 0
100 %, while ``beta`` in [0, 1] stayed at 50 %. Not every seed generalises: seed 3 fitted length 40 (87-97 %
at 500 or 1000 steps) with a solution that falls to chance beyond it.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from functools import partial
from typing import TypedDict

import torch
from torch import nn

from ....errors import ArgumentError
from ....models import TransformerLM
from ....nn import DeltaNet
from ... import tasks
from . import Built, Experiment
from .tokens import TokenObjective
from .train import Budget

__all__ = ["NEGATIVE_BETA", "TRAIN_LENGTH", "LONGEST", "BANDS", "WIDTH", "TASKS", "MECHANISMS", "USES", "CLAIM",
           "BUDGETS", "LSTMTagger", "StateObjective", "deltanet", "state_experiments", "KEYS"]

TRAIN_LENGTH = 40
LONGEST = 256
BANDS = (TRAIN_LENGTH, 64, 128, 4 * TRAIN_LENGTH, LONGEST)  # the ends of the bands of test lengths
WIDTH = 32
_BUDGET = (Budget(steps=250, lr=3e-3, test_size=512), Budget(steps=150, lr=3e-3, test_size=512))
BUDGETS = {"parity": (Budget(steps=500, lr=9e-3, test_size=512), Budget(steps=150, lr=9e-3, test_size=512))}
"""Task name -> (budget, quick budget) where a task trains otherwise than the others (see the module docstring)."""
NEGATIVE_BETA = "allow_neg_eigval" in inspect.signature(DeltaNet).parameters
"""Whether :class:`~attnkit.nn.DeltaNet` offers ``beta`` in [0, 2] (``allow_neg_eigval``)."""
_TEST_SEED = 3_000_017  # the long batch of the length bands, apart from the training and test streams

# task name of the tour -> (registered task, its sizes, what it is)
TASKS = {
    "parity": ("parity", {}, "parity of the bits so far"),
    "modular_count": ("modular_count", {"modulus": 3}, "ones so far modulo 3"),
    "word_problem_s3": ("word_problem_s3", {}, "running product in S3 (6 permutations, solvable)"),
    "word_problem_a5": ("word_problem_a5", {}, "running product in A5 (60 permutations, simple: NC1-complete)"),
}


class LSTMTagger(nn.Module):
    """Embedding, one :class:`torch.nn.LSTM` layer (Hochreiter & Schmidhuber 1997) and a linear read-out per position.

    Shapes: ``tokens (B, n)`` long -> logits ``(B, n, num_classes)``.
    """

    def __init__(self, vocab_size: int, num_classes: int, dim: int):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.lstm = nn.LSTM(dim, dim, batch_first=True)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embed(tokens))[0])


def deltanet(dim: int, num_heads: int, causal: bool = True, *, negative: bool = False) -> DeltaNet:
    """A :class:`~attnkit.nn.DeltaNet` layer; ``negative``: ``beta`` in [0, 2] through its ``allow_neg_eigval``
    option (an ArgumentError when this DeltaNet has none)."""
    if not negative:
        return DeltaNet(dim, num_heads)
    if "allow_neg_eigval" not in inspect.signature(DeltaNet).parameters:
        raise ArgumentError("deltanet: negative=True needs DeltaNet's allow_neg_eigval option (beta in [0, 2]); "
                            "this DeltaNet has none")
    return DeltaNet(dim, num_heads, allow_neg_eigval=True)


def _lm(attention, positional: str | None = None):
    def build(task) -> nn.Module:
        # one vocabulary for the inputs and the output layer: wide enough for both (counting modulo 3 reads bits)
        return TransformerLM(max(task.vocab_size, task.num_classes), dim=WIDTH, num_heads=1, num_layers=1,
                             causal=True, dropout=0.0, norm_first=True, positional=positional, attention=attention,
                             max_len=None)
    return build


# name -> (model builder from the task, what it is)
MECHANISMS = {
    "softmax-rope": (_lm("softmax", "rotary"), "softmax attention with rotary positions"),
    "softmax-nope": (_lm("softmax"), "softmax attention without positions (causal masking only)"),
    "deltanet": (_lm(deltanet), "DeltaNet, beta in [0, 1]: transition eigenvalues in [0, 1]"),
    "deltanet-neg": (_lm(partial(deltanet, negative=True)),
                     "DeltaNet, beta in [0, 2]: transition eigenvalues in [-1, 1] (Grazzi et al. 2025)"),
    "gated-deltanet": (_lm("gated-deltanet"), "Gated DeltaNet, beta in [0, 1], a decay per head"),
    "mamba2": (_lm("mamba2"), "Mamba-2's mixer: a positive decay per head"),
    "lstm": (lambda task: LSTMTagger(task.vocab_size, task.num_classes, WIDTH), "an LSTM (torch.nn.LSTM)"),
}
_LM = ("causal",)
USES = {"softmax-rope": (*_LM, "multi-head", "scaled-dot-product", "rotary-embedding"),
        "softmax-nope": (*_LM, "multi-head", "scaled-dot-product"), "deltanet": ("deltanet",),
        "deltanet-neg": ("deltanet",), "gated-deltanet": ("gated-deltanet",), "mamba2": ("mamba2",), "lstm": ()}


class StateClaim(TypedDict):
    """The claim the state-tracking experiment tests: its text and source, the task, the mechanism that solves it
    and the one that fails, the accuracy the first reaches, chance, and the margin above chance the second stays
    within."""

    statement: str
    source: str
    task: str
    solves: str
    fails: str
    level: float
    chance: float
    margin: float


CLAIM: StateClaim = {
    "statement": "DeltaNet with negative eigenvalues (beta in [0, 2]) reaches at least 90 % on parity at test lengths "
                 "up to 4x the training length, and with beta in [0, 1] it stays within 10 points of chance",
    "source": "Grazzi et al. 2025, arXiv:2411.12537, Sec. 5.1, Table 2",
    "task": "parity", "solves": "deltanet-neg", "fails": "deltanet", "level": 0.9, "chance": 0.5, "margin": 0.1}


class StateObjective(TokenObjective):
    """Per-position cross-entropy and accuracy (:class:`TokenObjective`), plus the accuracy at each band of test
    lengths: ``length_<L>`` for each ``L`` of :data:`BANDS`, over the states after ``L_prev + 1 .. L`` tokens of
    512 sequences of length :data:`LONGEST` (drawn from a fixed generator)."""

    def extra(self, model, batch, task):
        longer = replace(task, seq_len=LONGEST, scored_from=0)
        long_batch = longer.sample(512, torch.Generator().manual_seed(_TEST_SEED))
        right = model(long_batch["inputs"]).argmax(-1) == long_batch["targets"]  # (512, LONGEST)
        out, start = {}, 0
        for end in BANDS:
            out[f"length_{end}"] = right[:, start:end].double().mean().item()
            start = end
        return out


def _build(task_name: str, mechanism: str) -> Built:
    registered, sizes, _ = TASKS[task_name]
    train = tasks.get(registered, seq_len=TRAIN_LENGTH, **sizes)
    test = tasks.get(registered, seq_len=4 * TRAIN_LENGTH, scored_from=TRAIN_LENGTH, **sizes)
    return Built(MECHANISMS[mechanism][0](train), train, test, StateObjective())


def state_experiments() -> list[Experiment]:
    """One experiment per task and mechanism, keys ``<task>/<mechanism>`` (:data:`KEYS`; ``deltanet-neg`` only
    where :data:`NEGATIVE_BETA`)."""
    out = []
    for task_name, (_, _, what) in TASKS.items():
        budget, quick = BUDGETS.get(task_name, _BUDGET)
        head = (f"state tracking, {what}: trained on length {TRAIN_LENGTH}, tested on the states after "
                f"{TRAIN_LENGTH + 1}-{4 * TRAIN_LENGTH} tokens; 1 layer, width {WIDTH}")
        out += [Experiment(task_name, name, f"{head}: {text}", partial(_build, task_name, name), budget, quick,
                           uses=USES[name]) for name, (_, text) in MECHANISMS.items() if name in _AVAILABLE]
    return out


_AVAILABLE = tuple(name for name in MECHANISMS if NEGATIVE_BETA or name != "deltanet-neg")
KEYS = tuple(f"{task}/{name}" for task in TASKS for name in _AVAILABLE)
