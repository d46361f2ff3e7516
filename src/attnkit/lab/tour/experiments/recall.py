"""Recall against state size: multi-query associative recall at several model widths, Zoology's experiment.

Arora et al. 2023, "Zoology: Measuring and Improving Recall in Efficient Language Models",
arXiv:2312.04927, Sec. 3-4 (Fig. 2): the MQAR accuracy of 2-layer models against their width,
and against the state they decode from. Softmax attention keeps every key and value (its KV cache
grows with the context); a recurrence keeps a fixed state, whose size the width sets. Here every
mechanism of :data:`MECHANISMS` trains the same 2-layer causal pre-norm language model
(:func:`~.tokens.language_model`, one head) at each width of :data:`WIDTHS` on MQAR
(:data:`RECALL`), with one budget. :func:`state_bytes` is the decoding state of one of its layers
for one sequence at the task's length, as the layer's cost spec counts it
(:mod:`attnkit.costing.analytic`); the report's section (:mod:`attnkit.lab.tour.report.recall`) draws
accuracy against it and checks :data:`CLAIM`.

The budget was set on seed 0 on a busy 2-core machine, one thread: in 200 steps of
128 sequences, at width 16, softmax attention and DeltaNet reach 99 %, Mamba-2 93 %, Gated
DeltaNet (whose decays start strong: ``A`` up to 16) 41 %, GLA and linear attention stay at the
~33 % of guessing among the values in context; at width 8 DeltaNet reaches 49 %, every other
mechanism 14-25 %. 150 steps or batches of 64 left softmax attention below 50 % at width 16.
Width 32 (Gated DeltaNet 100 %, Mamba-2 89 %) was left out for time: the sweep trains 12 models
x 3 seeds, 5-13 s each there (about 7 minutes with the processes' start-up).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from ....nn import DeltaNet, GatedDeltaNet, GatedLinearAttention, LinearAttention, Mamba2Mixer, MultiHeadAttention
from ....nn._recurrent import RecurrentLayer
from ... import tasks
from . import Built, Experiment
from .tokens import MQARObjective, language_model
from .train import Budget

__all__ = ["TASK", "RECALL", "WIDTHS", "HEADS", "MECHANISMS", "USES", "CLAIM", "layer_state_bytes", "state_bytes",
           "recall_experiments", "KEYS"]

TASK = "mqar"
RECALL = {"num_pairs": 4, "num_keys": 16, "num_values": 16, "gap": 0}
LENGTH = tasks.get("mqar", **RECALL).seq_len
WIDTHS = (8, 16)
HEADS = 1


def _mamba2(dim: int, num_heads: int) -> Mamba2Mixer:
    """Mamba-2 with its paper's expansion (2) and one SSD head per attention head, state size 16."""
    return Mamba2Mixer(dim, head_dim=2 * dim // num_heads, state_dim=16, chunk_size=LENGTH)


# name -> (the attention of language_model(), what it is). The linear and recurrent layers run the whole sequence
# as one block (chunk_size = LENGTH): their chunked form without padding.
MECHANISMS = {
    "softmax": ("softmax", "softmax attention: its KV cache grows with the context"),
    "linear": (partial(LinearAttention, chunk_size=LENGTH),
               "linear attention (Katharopoulos et al. 2020): additive, no decay"),
    "gla": (partial(GatedLinearAttention, chunk_size=LENGTH),
            "gated linear attention (Yang et al. 2023): additive, a decay per key channel"),
    "mamba2": (_mamba2, "Mamba-2's mixer (Dao & Gu 2024): a decay per head, state 16 per channel"),
    "deltanet": (partial(DeltaNet, chunk_size=LENGTH), "DeltaNet (Yang et al. 2024): the delta rule"),
    "gated-deltanet": (partial(GatedDeltaNet, chunk_size=LENGTH),
                       "Gated DeltaNet (Yang et al. 2024): the delta rule with a decay per head"),
}
# name -> the registry entries its model exercises (the catalogue of attnkit.lab.tour.catalogue)
USES = {"softmax": ("multi-head", "sinusoidal-positional-encoding", "causal", "scaled-dot-product"),
        "linear": ("linear-attention",), "gla": ("gla",), "mamba2": ("mamba2",), "deltanet": ("deltanet",),
        "gated-deltanet": ("gated-deltanet",)}
CLAIM = {"statement": "the delta rule recalls far better than additive linear attention at equal state",
         "source": "Yang et al. 2024, arXiv:2406.06484, Sec. 5.1 (MQAR); Arora et al. 2023, arXiv:2312.04927",
         "better": "deltanet", "worse": "linear"}


def layer_state_bytes(model: nn.Module, length: int) -> int:
    """The decoding state of ``model``'s first attention layer for one sequence of ``length`` tokens, in bytes:
    a recurrent layer's fixed state or a softmax layer's KV cache, as their cost specs count them."""
    from ....costing.analytic import cost

    for module in model.modules():
        if isinstance(module, (RecurrentLayer, LinearAttention)):
            return cost(module, batch=1, length=length).state_bytes
        if isinstance(module, MultiHeadAttention):
            return cost("multi-head", batch=1, q_len=length, embed_dim=module.embed_dim, heads=module.num_heads,
                        kv_heads=module.num_kv_heads).state_bytes
    raise TypeError(f"layer_state_bytes: no attention layer in {type(model).__name__}")


def state_bytes(mechanism: str, width: int) -> int:
    """The decoding state of one layer of the model of ``mechanism`` at ``width``, for one sequence of the task
    (:func:`layer_state_bytes`; the model is built under a forked RNG, so the caller's stream is untouched)."""
    with torch.random.fork_rng(devices=[]):
        return layer_state_bytes(_build(mechanism, width).model, LENGTH)


def _build(mechanism: str, width: int) -> Built:
    task = tasks.get("mqar", **RECALL)
    return Built(language_model(task, MECHANISMS[mechanism][0], dim=width, heads=HEADS), task, task, MQARObjective())


def recall_experiments() -> list[Experiment]:
    """One experiment per mechanism and width, keys ``mqar/<mechanism>-d<width>`` (:data:`KEYS`)."""
    budget, quick = Budget(steps=200, batch_size=128, lr=1e-2), Budget(steps=120, batch_size=128, lr=1e-2)
    head = (f"MQAR ({RECALL['num_pairs']} pairs of {RECALL['num_keys']} keys) against state size, 2-layer causal "
            f"pre-norm LM, {HEADS} head")
    return [Experiment(TASK, f"{name}-d{width}", f"{head}, width {width}: {text}", partial(_build, name, width),
                       budget, quick, uses=USES[name]) for name, (_, text) in MECHANISMS.items() for width in WIDTHS]


KEYS = tuple(f"{TASK}/{name}-d{width}" for name in MECHANISMS for width in WIDTHS)
