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

from functools import partial

import torch
import torch.nn.functional as F

from ....models import TransformerLM
from ....nn.differential import DifferentialAttention, lambda_init
from ... import tasks
from . import Built, Experiment
from .sinks import first_token_mass
from .tokens import MQARObjective, TokenObjective, record_maps
from .train import Budget

__all__ = ["BackcopyObjective", "experiments"]

NOISY_MQAR = {"num_pairs": 8, "num_queries": 2, "num_keys": 24, "num_values": 8, "gap": 0}


class BackcopyObjective(TokenObjective):
    """Next-token loss everywhere, accuracy after triggers, and ``first_token_mass`` (:func:`.sinks.first_token_mass`)
    on 256 test examples."""

    def loss(self, model, batch, task):
        return F.cross_entropy(model(batch["inputs"]).transpose(1, 2), batch["next"])

    def labels(self, ids, task):
        return ["BOS" if i == 0 else f"T{i}" if task.is_trigger(torch.tensor(i)) else str(i) for i in ids]

    def extra(self, model, batch, task):
        maps = record_maps(model, batch["inputs"][:256])
        return {"first_token_mass": first_token_mass(maps) if maps else float("nan")}


def _sink(gate: bool) -> Built:
    task = tasks.get("bigram_backcopy")
    model = TransformerLM(task.vocab_size, dim=64, num_heads=2, num_layers=1, dropout=0.0, norm_first=True, gate=gate,
                          max_len=task.seq_len)
    return Built(model, task, task, BackcopyObjective())


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


_LM = ("sinusoidal-positional-encoding", "causal", "scaled-dot-product")  # what every model here is built on


def experiments() -> list[Experiment]:
    """The four experiments, in tour order."""
    sink = "Bigram-Backcopy (Guo et al. 2024), 1-layer causal pre-norm softmax Transformer, 2 heads"
    noisy = "MQAR among distractors (8 pairs, 2 queried), 2-layer causal pre-norm Transformer"
    sink_sizes = (("batch", 64), ("heads", 2), ("q_len", 32), ("kv_len", 32), ("embed_dim", 64))
    length = 2 * NOISY_MQAR["num_pairs"] + NOISY_MQAR["num_queries"]
    noisy_sizes = (("batch", 64), ("heads", 2), ("q_len", length), ("kv_len", length), ("embed_dim", 64),
                   ("length", length), ("dim", 64))
    # On seeds 0-1 the gated model's weight on BOS is a sixth to a half of the ungated one's by step 400, and
    # differential attention leaves the distractor plateau (~30 %) near step 250 while softmax stays on it.
    budget, quick = Budget(steps=400, lr=3e-3), Budget(steps=300, lr=3e-3)
    return [
        Experiment("bigram_backcopy", "softmax", f"{sink}: no gate; first_token_mass is the weight on BOS",
                   partial(_sink, False), budget, quick, "multi-head", sink_sizes, uses=(*_LM, "multi-head")),
        Experiment("bigram_backcopy", "gated", f"{sink}: sigmoid output gate (Qiu et al. 2025)", partial(_sink, True),
                   budget, quick, "gated-attention", sink_sizes, uses=(*_LM, "gated-attention")),
        Experiment("mqar", "distractors-softmax", f"{noisy}: softmax attention", partial(_noisy, False), budget,
                   quick, "multi-head", noisy_sizes, uses=(*_LM, "multi-head")),
        Experiment("mqar", "distractors-differential", f"{noisy}: differential attention (Ye et al. 2024), 2 heads "
                   "of 2 maps each", partial(_noisy, True), budget, quick, "differential", noisy_sizes,
                   uses=(*_LM, "differential")),
    ]
