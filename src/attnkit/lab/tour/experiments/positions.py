"""Length extrapolation: position encodings trained at one length and tested at four times it, on lag copy.

Press et al. 2022, "Train Short, Test Long" (arXiv:2108.12409): ALiBi's linear distance penalty lets a model
trained at length L keep its quality at longer lengths, where sinusoidal and learned absolute positions fail and
T5's relative bias holds (their Fig. 1, Sec. 3-4). Here the task is :class:`~attnkit.lab.tasks.lag_copy.LagCopy`
(copy the token :data:`LAG` back, vocabulary 8, chance 12.5 %): every mechanism trains the same one-layer causal
pre-norm model (width :data:`WIDTH`, :data:`HEADS` heads) at length :data:`TRAIN_LENGTH` and is scored on the positions
``TRAIN_LENGTH + 1 .. 4 TRAIN_LENGTH`` of longer sequences (the run's accuracy);
:class:`ExtrapolationObjective` adds ``train_length`` (the accuracy on sequences of the training length), so a
mechanism that fits and does not extrapolate shows as such. FoX (Lin et al. 2025, arXiv:2503.02130) and PaTH
(Yang et al. 2025, arXiv:2505.16381) run without other positions, as their papers do. Claims: :data:`CLAIMS`
(:func:`.claims.decide`).

Sizes were set on seed 0 on a busy 2-core machine: with 2 heads ALiBi's slopes (1/16, 1/256) are too flat to
single out the previous token (37 % at 4x), and with the token 2 back ALiBi's monotone penalty cannot pick it in one
layer; with 8 heads (slopes 1/2 .. 1/256) and lag 1, ALiBi reaches 99 %. T5's buckets end at the training
length, as T5's do below its training length, so no bucket is first seen at test (with buckets up to 128 it
fell to 44 %). Keys ``lag_copy/<mechanism>`` (:data:`KEYS`): ``attnkit tour --tasks lag_copy``.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import torch

from .... import bias as biases
from ....bias import RelativePositionBias
from ....models import TransformerLM
from ....nn.forgetting import ForgettingAttention
from ....nn.path import PaTHAttention
from ... import tasks
from . import Built, Experiment
from .claims import Claim
from .tokens import TokenObjective
from .train import Budget
from .variants import OptionAttention

__all__ = ["TASK", "TRAIN_LENGTH", "LAG", "WIDTH", "BUDGET", "QUICK", "MECHANISMS", "USES", "CLAIMS",
           "ExtrapolationObjective", "position_experiments", "KEYS"]

TASK = "lag_copy"
TRAIN_LENGTH, LAG, VOCAB, WIDTH, HEADS = 32, 1, 8, 64, 8
LEVEL = 0.9
BUDGET = Budget(steps=200, lr=1e-2, test_size=512)
QUICK = Budget(steps=100, lr=1e-2, test_size=256)
_TEST_SEED = 4_000_037


def _alibi(dim: int, num_heads: int) -> OptionAttention:
    return OptionAttention(dim, num_heads, bias=biases.alibi(num_heads))


def _t5(dim: int, num_heads: int) -> OptionAttention:
    return OptionAttention(dim, num_heads, bias=RelativePositionBias(num_heads, num_buckets=16,
                                                                     max_distance=TRAIN_LENGTH,
                                                                     bidirectional=False))


# name -> (attention, positional encoding of TransformerLM, what it is)
MECHANISMS = {
    "sinusoidal": ("softmax", "sinusoidal", "softmax attention, sinusoidal positions (Vaswani et al. 2017)"),
    "learned": ("softmax", "learned", "softmax attention, learned absolute positions (Gehring et al. 2017): the "
                "rows past the training length are never trained"),
    "nope": ("softmax", None, "softmax attention without positions (the causal mask only)"),
    "alibi": (_alibi, None, "ALiBi's per-head linear distance penalty, no other positions (Press et al. 2022)"),
    "relative-bias": (_t5, None, "T5's learned relative-position bias, 16 log buckets up to the training length "
                      "(Raffel et al. 2020)"),
    "fox": (ForgettingAttention, None, "Forgetting Transformer: a forget gate decays the scores (Lin et al. 2025)"),
    "path": (PaTHAttention, None, "PaTH: data-dependent Householder reflections between positions (Yang et al. "
             "2025)"),
}
USES = {"sinusoidal": ("causal", "multi-head", "scaled-dot-product", "sinusoidal-positional-encoding"),
        "learned": ("causal", "multi-head", "scaled-dot-product", "learned-positional-embedding"),
        "nope": ("causal", "multi-head", "scaled-dot-product"), "alibi": ("causal", "alibi"),
        "relative-bias": ("causal", "relative-position-bias"), "fox": ("forgetting-attention",),
        "path": ("path-attention",)}

_PRESS = "Press et al. 2022, arXiv:2108.12409"
CLAIMS: tuple[Claim, ...] = (
    Claim(f"ALiBi trained at length {TRAIN_LENGTH} keeps at least {100 * LEVEL:.0f} % at lengths up to 4x",
          f"{_PRESS}, Sec. 4, Fig. 1", TASK, "alibi", LEVEL),
    Claim("sinusoidal positions extrapolate worse than ALiBi", f"{_PRESS}, Sec. 2, Fig. 1", TASK, "alibi",
          "sinusoidal"),
    Claim("learned absolute positions cannot extrapolate: below ALiBi past the training length",
          f"{_PRESS}, Sec. 2", TASK, "alibi", "learned"),
    Claim(f"T5's relative bias extrapolates: at least {100 * LEVEL:.0f} % at lengths up to 4x",
          f"{_PRESS}, Sec. 2.2, Fig. 1", TASK, "relative-bias", LEVEL),
    Claim(f"FoX extrapolates past its training length: at least {100 * LEVEL:.0f} % at lengths up to 4x",
          "Lin et al. 2025, arXiv:2503.02130, Sec. 4.2 (length extrapolation)", TASK, "fox", LEVEL),
    Claim(f"PaTH extrapolates past its training length: at least {100 * LEVEL:.0f} % at lengths up to 4x",
          "Yang et al. 2025, arXiv:2505.16381, Sec. 4 (length extrapolation)", TASK, "path", LEVEL),
)
"""The claims of this experiment (:func:`.claims.decide`)."""


class ExtrapolationObjective(TokenObjective):
    """Per-position loss and accuracy (:class:`TokenObjective`), plus ``train_length``: the accuracy on 256 sequences
    of the training length (every position from the lag on, a fixed generator)."""

    def extra(self, model, batch, task):
        short = replace(task, seq_len=TRAIN_LENGTH, scored_from=0)
        data = short.sample(256, torch.Generator().manual_seed(_TEST_SEED))
        return {"train_length": short.accuracy(model(data["inputs"]).argmax(-1), data)}


def _build(mechanism: str) -> Built:
    train = tasks.get("lag_copy", seq_len=TRAIN_LENGTH, vocab=VOCAB, lag=LAG)
    test = tasks.get("lag_copy", seq_len=4 * TRAIN_LENGTH, vocab=VOCAB, lag=LAG, scored_from=TRAIN_LENGTH)
    attn, positional, _ = MECHANISMS[mechanism]
    model = TransformerLM(VOCAB, dim=WIDTH, num_heads=HEADS, num_layers=1, causal=True, dropout=0.0, norm_first=True,
                          attention=attn, positional=positional, max_len=4 * TRAIN_LENGTH)
    return Built(model, train, test, ExtrapolationObjective())


def position_experiments() -> list[Experiment]:
    """One experiment per mechanism of :data:`MECHANISMS`, keys ``lag_copy/<mechanism>``."""
    head = (f"lag copy (the token {LAG} back, vocabulary {VOCAB}): trained at length {TRAIN_LENGTH}, scored at "
            f"positions {TRAIN_LENGTH + 1}-{4 * TRAIN_LENGTH}; 1 layer, width {WIDTH}, {HEADS} heads")
    return [Experiment(TASK, name, f"{head}: {text}", partial(_build, name), BUDGET, QUICK, uses=USES[name])
            for name, (_, _, text) in MECHANISMS.items()]


KEYS = tuple(f"{TASK}/{name}" for name in MECHANISMS)
