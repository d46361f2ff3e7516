"""Recent recurrences against their papers' claims: recall at equal width (MQAR) and state tracking (S3).

- Recall (``recurrent_recall``): Zoology's MQAR at width :data:`WIDTH` (:data:`.recall.RECALL`, 4 pairs, one
  head, 2 layers), the recall experiment's budget; softmax, Mamba-2 and Gated DeltaNet as there, with
  MiniMax's lightning attention (a fixed decay per head), RWKV-4's time mixing, Comba, and the log-linear
  forms of Mamba-2 and Gated DeltaNet (Guo et al. 2025).
- State tracking (``delta_products``): the S3 word problem as in :mod:`.state` (trained at length 40, scored at
  41-160), DeltaNet with ``beta`` in [0, 2] (one reflection per token) against DeltaProduct with two
  (Siems et al. 2025, arXiv:2502.10297) and RWKV-7's generalized delta rule (Peng et al. 2025).

Claims: :data:`CLAIMS` (:func:`.claims.decide`). Keys ``<task>/<mechanism>`` (:data:`KEYS`):
``attnkit tour --tasks recurrent_recall delta_products``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ....models import TransformerLM
from ....nn import GatedDeltaNet
from ....nn.comba import Comba
from ....nn.delta_product import DeltaProduct
from ....nn.lightning import LightningAttention
from ....nn.log_linear import LogLinearGatedDeltaNet, LogLinearMamba2
from ....nn.rwkv import RWKV4TimeMixing
from ....nn.rwkv7 import RWKV7TimeMixing
from ... import tasks
from . import Built, Experiment
from .claims import Claim
from .recall import LENGTH, RECALL, _mamba2
from .state import _BUDGET, TRAIN_LENGTH, StateObjective, deltanet
from .state import WIDTH as STATE_WIDTH
from .tokens import MQARObjective, language_model
from .train import Budget

__all__ = ["RECALL_TASK", "STATE_TASK", "WIDTH", "RECALL_MECHANISMS", "STATE_MECHANISMS", "USES", "CLAIMS",
           "recurrence_experiments", "KEYS"]

RECALL_TASK, STATE_TASK = "recurrent_recall", "delta_products"
WIDTH, HEADS = 16, 1
_RECALL_BUDGET = (Budget(steps=200, batch_size=128, lr=1e-2), Budget(steps=120, batch_size=128, lr=1e-2))

# name -> (attention factory (dim, num_heads), what it is)
RECALL_MECHANISMS: dict[str, tuple[Any, str]] = {
    "softmax": ("softmax", "softmax attention"),
    "mamba2": (_mamba2, "Mamba-2's mixer, state 16 per channel"),
    "gated-deltanet": (partial(GatedDeltaNet, chunk_size=LENGTH), "Gated DeltaNet"),
    "lightning": (partial(LightningAttention, chunk_size=LENGTH),
                  "lightning attention (MiniMax 2025): linear attention with a fixed decay per head"),
    "rwkv4": (lambda dim, num_heads: RWKV4TimeMixing(dim, chunk_size=LENGTH),
              "RWKV-4's time mixing (Peng et al. 2023): a fixed decay per channel"),
    "comba": (partial(Comba, chunk_size=LENGTH), "Comba (Hu et al. 2025): Gated DeltaNet with a scaled-key read"),
    "log-linear-mamba2": (lambda dim, num_heads: LogLinearMamba2(dim, num_heads, max_length=LENGTH, head_dim=2 * dim,
                                                                 state_dim=16, chunk_size=LENGTH),
                          "log-linear Mamba-2 (Guo et al. 2025): Fenwick buckets of states"),
    "log-linear-gated-deltanet": (lambda dim, num_heads: LogLinearGatedDeltaNet(dim, num_heads, max_length=LENGTH,
                                                                                chunk_size=LENGTH),
                                  "log-linear Gated DeltaNet (Guo et al. 2025)"),
}
STATE_MECHANISMS = {
    "deltanet-neg": (partial(deltanet, negative=True), "DeltaNet, beta in [0, 2]: one reflection per token"),
    "delta-product": (lambda dim, num_heads: DeltaProduct(dim, num_heads, num_householder=2, allow_neg_eigval=True),
                      "DeltaProduct with 2 Householder reflections per token, beta in [0, 2] (Siems et al. 2025)"),
    "rwkv7": (RWKV7TimeMixing, "RWKV-7's time mixing: the generalized delta rule (Peng et al. 2025)"),
}
USES = {f"{RECALL_TASK}/softmax": ("multi-head", "sinusoidal-positional-encoding", "causal", "scaled-dot-product"),
        f"{RECALL_TASK}/mamba2": ("mamba2",), f"{RECALL_TASK}/gated-deltanet": ("gated-deltanet",),
        f"{RECALL_TASK}/lightning": ("lightning-attention",), f"{RECALL_TASK}/rwkv4": ("rwkv4",),
        f"{RECALL_TASK}/comba": ("comba",), f"{RECALL_TASK}/log-linear-mamba2": ("log-linear-mamba2",),
        f"{RECALL_TASK}/log-linear-gated-deltanet": ("log-linear-gated-deltanet",),
        f"{STATE_TASK}/deltanet-neg": ("deltanet",), f"{STATE_TASK}/delta-product": ("delta-product",),
        f"{STATE_TASK}/rwkv7": ("rwkv7",)}

_GUO = "Guo et al. 2025, arXiv:2506.04761, Sec. 4 (MQAR)"
CLAIMS: tuple[Claim, ...] = (
    Claim("pure linear attention with a fixed decay retrieves worse than softmax attention (hence MiniMax-01's "
          "softmax layer every eighth)", "MiniMax 2025, arXiv:2501.08313, Sec. 2.2", RECALL_TASK, "softmax",
          "lightning"),
    Claim("RWKV's fixed-decay recurrence recalls below attention on MQAR at equal width",
          "Arora et al. 2023, arXiv:2312.04927, Sec. 3 (Fig. 2)", RECALL_TASK, "softmax", "rwkv4"),
    Claim("Comba recalls better than Gated DeltaNet", "Hu et al. 2025, arXiv:2506.02475 (abstract)",
          RECALL_TASK, "comba", "gated-deltanet"),
    Claim("log-linear Mamba-2 recalls better than Mamba-2", _GUO, RECALL_TASK, "log-linear-mamba2", "mamba2"),
    Claim("log-linear Gated DeltaNet recalls better than Gated DeltaNet", _GUO, RECALL_TASK,
          "log-linear-gated-deltanet", "gated-deltanet"),
    Claim("DeltaProduct with two reflections per token (and negative eigenvalues) tracks S3, where DeltaNet with "
          "one cannot: above DeltaNet at lengths up to 4x", "Siems et al. 2025, arXiv:2502.10297, Sec. 5 (Fig. 3)",
          STATE_TASK, "delta-product", "deltanet-neg"),
    Claim("RWKV-7's generalized delta rule tracks states: at least 90 % on S3 at lengths up to 4x",
          "Peng et al. 2025, arXiv:2503.14456 (abstract: state tracking)", STATE_TASK, "rwkv7", 0.9),
)
"""The claims of these experiments (:func:`.claims.decide`)."""


def _recall(mechanism: str) -> Built:
    task = tasks.get("mqar", **RECALL)
    return Built(language_model(task, RECALL_MECHANISMS[mechanism][0], dim=WIDTH, heads=HEADS), task, task,
                 MQARObjective())


def _state(mechanism: str) -> Built:
    train = tasks.S3WordProblem(seq_len=TRAIN_LENGTH)
    test = tasks.S3WordProblem(seq_len=4 * TRAIN_LENGTH, scored_from=TRAIN_LENGTH)
    model = TransformerLM(max(train.vocab_size, train.num_classes), dim=STATE_WIDTH, num_heads=1, num_layers=1,
                          causal=True, dropout=0.0, norm_first=True, positional=None,
                          attention=STATE_MECHANISMS[mechanism][0], max_len=None)
    return Built(model, train, test, StateObjective())


def recurrence_experiments() -> list[Experiment]:
    """The recall and state-tracking experiments, keys :data:`KEYS`."""
    recall = (f"MQAR ({RECALL['num_pairs']} pairs of {RECALL['num_keys']} keys), 2-layer causal pre-norm LM, width "
              f"{WIDTH}, {HEADS} head")
    state = (f"S3 word problem: trained on length {TRAIN_LENGTH}, tested on the states after {TRAIN_LENGTH + 1}-"
             f"{4 * TRAIN_LENGTH} tokens; 1 layer, width {STATE_WIDTH}")
    return [*(Experiment(RECALL_TASK, name, f"{recall}: {text}", partial(_recall, name), *_RECALL_BUDGET,
                         uses=USES[f"{RECALL_TASK}/{name}"]) for name, (_, text) in RECALL_MECHANISMS.items()),
            *(Experiment(STATE_TASK, name, f"{state}: {text}", partial(_state, name), *_BUDGET,
                         uses=USES[f"{STATE_TASK}/{name}"]) for name, (_, text) in STATE_MECHANISMS.items())]


KEYS = tuple([*(f"{RECALL_TASK}/{n}" for n in RECALL_MECHANISMS), *(f"{STATE_TASK}/{n}" for n in STATE_MECHANISMS)])
