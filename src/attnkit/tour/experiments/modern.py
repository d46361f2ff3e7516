"""Two claims of recent attention papers at CPU scale: gates drain the first-token sink; differential attention
finds the needle among distractors.

- Qiu et al. 2025 (arXiv:2505.06708): a sigmoid output gate after attention lets a head output
  nothing, so it no longer parks its attention on the first token (the "attention sink"). Sinks
  appear in a one-layer model on Guo et al. 2024's Bigram-Backcopy task (arXiv:2410.13835, Sec. 2):
  a head is needed only after a trigger token (copy the token before it) and is "dormant" elsewhere,
  where it attends to BOS. The same model with and without ``gate=True``; :class:`SinkObjective`
  reports the mean attention weight on position 0 (``first_token_mass``).
- Ye et al. 2024 (arXiv:2410.05258): subtracting two softmax maps cancels the attention both give
  to irrelevant context, which helps retrieval among many distractors. MQAR with 8 pairs of which
  2 are queried (6 distractor pairs), softmax against :class:`~attnkit.nn.DifferentialAttention`
  at the same width, depth and budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import ClassVar

import torch
import torch.nn.functional as F

from ... import tasks
from ...errors import check_int
from ...models import TransformerLM
from ...nn.differential import DifferentialAttention, lambda_init
from ...tasks.base import IGNORE_INDEX, Task
from . import Built, Experiment
from .tokens import MQARObjective, TokenObjective, record_maps
from .train import Budget

__all__ = ["BigramBackcopy", "SinkObjective", "first_token_mass", "experiments"]

NOISY_MQAR = {"num_pairs": 8, "num_queries": 2, "num_keys": 24, "num_values": 8, "gap": 0}


@dataclass(frozen=True)
class BigramBackcopy(Task):
    """Guo et al. 2024's Bigram-Backcopy task: a bigram chain whose trigger tokens are followed by a copy.

    ``x_0 = BOS``; after a trigger ``x_{t+1} = x_{t-1}`` (back-copy), otherwise ``x_{t+1}`` is one of
    three successors of ``x_t`` fixed by ``table_seed``, uniformly. ``inputs = x_0 .. x_{L-1}``;
    ``next`` holds every next token (the language-model loss), ``targets`` only those after a trigger
    (the metric: the deterministic, attention-dependent positions).

    Args:
        vocab_size: tokens, BOS (0) included.
        triggers: the last ``triggers`` ids are triggers.
        length: ``L``.
        table_seed: seeds the successor table.
    """

    name: ClassVar[str] = "bigram_backcopy"
    kind: ClassVar[str] = "tokens"
    needs_causal_model: ClassVar[bool] = True

    vocab_size: int = 24
    triggers: int = 3
    length: int = 32
    table_seed: int = 123

    def __post_init__(self):
        check_int("BigramBackcopy", "triggers", self.triggers, 1)
        check_int("BigramBackcopy", "vocab_size", self.vocab_size, self.triggers + 2)
        check_int("BigramBackcopy", "length", self.length, 2)

    @property
    def num_classes(self) -> int:
        return self.vocab_size

    @property
    def seq_len(self) -> int:
        return self.length

    def is_trigger(self, ids: torch.Tensor) -> torch.Tensor:
        return ids >= self.vocab_size - self.triggers

    def _sample(self, n, generator):
        table = torch.randint(1, self.vocab_size, (self.vocab_size, 3),
                              generator=torch.Generator().manual_seed(self.table_seed))
        x = torch.zeros(n, self.length + 1, dtype=torch.long)
        x[:, 1] = torch.randint(1, self.vocab_size - self.triggers, (n,), generator=generator)
        for t in range(1, self.length):
            successor = table[x[:, t], torch.randint(0, 3, (n,), generator=generator)]
            x[:, t + 1] = torch.where(self.is_trigger(x[:, t]), x[:, t - 1], successor)
        inputs, following = x[:, :-1], x[:, 1:]
        targets = torch.where(self.is_trigger(inputs), following, torch.full_like(following, IGNORE_INDEX))
        return {"inputs": inputs, "targets": targets, "next": following}

    def describe(self) -> str:
        return (f"bigram_backcopy: {self.vocab_size} tokens, {self.triggers} triggers, length {self.length} "
                "(tokens; accuracy after triggers)")


def first_token_mass(model, inputs: torch.Tensor) -> float:
    """Mean attention weight on key 0 over queries 1.. (query 0 has no other key), heads and layers."""
    maps = record_maps(model, inputs)
    return float(torch.stack([w[:, :, 1:, 0].mean() for w in maps.values()]).mean()) if maps else float("nan")


class SinkObjective(TokenObjective):
    """Next-token loss everywhere, accuracy after triggers, and ``first_token_mass`` on 256 test examples."""

    def loss(self, model, batch, task):
        return F.cross_entropy(model(batch["inputs"]).transpose(1, 2), batch["next"])

    def labels(self, ids, task):
        return ["BOS" if i == 0 else f"T{i}" if task.is_trigger(torch.tensor(i)) else str(i) for i in ids]

    def extra(self, model, batch, task):
        return {"first_token_mass": first_token_mass(model, batch["inputs"][:256])}


def _sink(gate: bool) -> Built:
    task = BigramBackcopy()
    model = TransformerLM(task.vocab_size, dim=64, num_heads=2, num_layers=1, dropout=0.0, norm_first=True, gate=gate,
                          max_len=task.seq_len)
    return Built(model, task, task, SinkObjective())


class _Differential:
    """``attention=`` factory of :class:`DifferentialAttention` layers, ``lambda_init`` by depth (eq. 2)."""

    def __init__(self):
        self.layers = 0

    def __call__(self, dim: int, num_heads: int, causal: bool = True) -> DifferentialAttention:
        self.layers += 1
        return DifferentialAttention(dim, num_heads, causal=causal, lambda_init=lambda_init(self.layers - 1))


def _noisy(differential: bool) -> Built:
    task = tasks.get("mqar", **NOISY_MQAR)
    model = TransformerLM(task.vocab_size, dim=64, num_heads=2, num_layers=2, dropout=0.0, norm_first=True,
                          attention=_Differential() if differential else "softmax", max_len=task.seq_len)
    return Built(model, task, task, MQARObjective())


def experiments() -> list[Experiment]:
    """The four experiments, in tour order."""
    sink = "Bigram-Backcopy (Guo et al. 2024), 1-layer causal pre-norm softmax Transformer, 2 heads"
    noisy = "MQAR among distractors (8 pairs, 2 queried), 2-layer causal pre-norm Transformer"
    sink_sizes = (("batch", 64), ("heads", 2), ("q_len", 32), ("kv_len", 32), ("embed_dim", 64))
    length = 2 * NOISY_MQAR["num_pairs"] + NOISY_MQAR["num_queries"]
    noisy_sizes = (("batch", 64), ("heads", 2), ("q_len", length), ("kv_len", length), ("embed_dim", 64),
                   ("length", length), ("dim", 64))
    # On seeds 0-1 the gated model's weight on BOS is a third to a half of the ungated one's by step 400, and
    # differential attention leaves the distractor plateau (~30 %) near step 250 while softmax stays on it.
    budget, quick = Budget(steps=400, lr=3e-3), Budget(steps=300, lr=3e-3)
    return [
        Experiment("backcopy_sinks", "softmax", f"{sink}: no gate; first_token_mass is the weight on BOS",
                   partial(_sink, False), budget, quick, "multi-head", sink_sizes),
        Experiment("backcopy_sinks", "gated", f"{sink}: sigmoid output gate (Qiu et al. 2025)", partial(_sink, True),
                   budget, quick, "gated-attention", sink_sizes),
        Experiment("noisy_mqar", "softmax", f"{noisy}: softmax attention", partial(_noisy, False), budget, quick,
                   "multi-head", noisy_sizes),
        Experiment("noisy_mqar", "differential", f"{noisy}: differential attention (Ye et al. 2024), 2 heads of 2 "
                   "maps each", partial(_noisy, True), budget, quick, "differential", noisy_sizes),
    ]
