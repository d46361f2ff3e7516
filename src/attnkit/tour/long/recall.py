"""Long-context recall: do data-dependent sparse attentions find key-value pairs far beyond a window?

Multi-query associative recall (Arora et al. 2023, arXiv:2312.04927, Sec. 3.1; :class:`attnkit.tasks.MQAR`)
at ``L >= 2048``: ``num_pairs`` key-value pairs open the sequence, ``gap`` filler tokens follow, then the
queries, so that every pair lies more than ``gap`` positions before every query. Four causal
two-layer Transformer LMs, equal but for their self-attention, are trained on it:

- ``softmax``: dense causal attention, every pair within reach;
- ``sliding-window``: causal softmax over the last ``window`` keys; two layers reach ``2 window < gap``
  positions back, so no pair is within reach (the claim's control);
- ``nsa``: :class:`attnkit.nn.NativeSparseAttention` (compressed, selected and window branches);
- ``moba``: :class:`attnkit.nn.MoBA` (the top-k key blocks by mean key).

NSA and MoBA attend a few blocks per query, chosen from the data, at a cost proportional to
``L k`` (the gathered selected-keys path): the claim is that their choice finds the pairs.
This module is the experiment as data and one training function; the long suite's runner runs
it (one process per run) and its report shows :data:`CLAIM`'s verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ... import masks, tasks
from ...errors import ArgumentError
from ...models import TransformerLM
from ...nn import MoBA, NativeSparseAttention
from ..experiments.tokens import MQARObjective
from ..experiments.train import Budget, Result, count_parameters, evaluate, fit
from .claims import Claim

__all__ = ["RecallSetting", "SETTINGS", "MECHANISMS", "CLAIM", "build", "train_recall", "holds", "TASK"]

TASK = "mqar-long"
MECHANISMS = ("softmax", "sliding-window", "nsa", "moba")
_EVAL_SEED, _TEST_SEED = 1_000_003, 2_000_003  # as the other tours: never the training stream


@dataclass(frozen=True)
class RecallSetting:
    """One scale of the experiment: the task's sizes, the mechanisms' spans, the model and the budget.

    ``window`` is the sliding window's span; NSA compresses blocks of ``block // 2`` every
    ``block // 4`` keys, selects ``selected`` blocks of ``block`` keys and keeps a window of
    ``block``; MoBA chooses ``selected`` blocks of ``block`` keys.
    """

    length: int
    pairs: int
    vocab: int  # keys and values each
    window: int
    block: int
    selected: int
    dim: int
    heads: int
    layers: int
    budget: Budget

    @property
    def gap(self) -> int:
        return self.length - 3 * self.pairs

    def __post_init__(self):
        if self.gap <= self.window * self.layers or self.gap <= self.block:
            raise ArgumentError(f"RecallSetting: the gap {self.gap} must exceed what the window ({self.window}, "
                                f"{self.layers} layers) and the local blocks ({self.block}) reach")


SETTINGS = {
    # L = 2048: 8 pairs 2024 positions before their queries; a window of 256 over 2 layers reaches 512
    "default": RecallSetting(2048, 8, 32, 256, 64, 4, 64, 2, 2, Budget(steps=400, batch_size=16, lr=3e-3,
                                                                       eval_size=64, test_size=256)),
    "quick": RecallSetting(256, 4, 16, 32, 16, 4, 32, 2, 2, Budget(steps=4, batch_size=4, lr=3e-3, eval_size=8,
                                                                   test_size=16)),
}

CLAIM = Claim(
    "sparse-selection-recalls",
    "With every key-value pair beyond a sliding window's reach (L >= 2048), NSA's selected blocks and MoBA's "
    "chosen blocks recall the pairs as dense attention does; the sliding window cannot.",
    "Yuan et al. 2025, arXiv:2502.11089, Sec. 4.3 (needle retrieval at 64k); Lu et al. 2025, arXiv:2502.13189, "
    "Sec. 3.2 (long-context evaluation on par with full attention); Arora et al. 2023, arXiv:2312.04927, Sec. 3",
    "accuracy", ("softmax", "nsa", "moba"), ("sliding-window",))


def _attention(name: str, s: RecallSetting):
    if name == "softmax":
        return "softmax", None
    if name == "sliding-window":
        return "softmax", masks.sliding_window(s.window, 0)
    if name == "nsa":
        return (lambda dim, heads: NativeSparseAttention(dim, heads, compress_block=s.block // 2,
                                                         compress_stride=s.block // 4, select_block=s.block,
                                                         num_selected=s.selected, window=s.block)), None
    if name == "moba":
        return (lambda dim, heads: MoBA(dim, heads, block_size=s.block, top_k=s.selected)), None
    raise ArgumentError(f"recall experiment: unknown mechanism {name!r}; known: {', '.join(MECHANISMS)}")


def task(s: RecallSetting) -> tasks.Task:
    """The MQAR task of a setting: ``pairs`` pairs and queries, ``gap`` fillers between them."""
    return tasks.get("mqar", num_pairs=s.pairs, num_keys=s.vocab, num_values=s.vocab, gap=s.gap)


def build(name: str, s: RecallSetting) -> TransformerLM:
    """The causal, pre-norm, dropout-free LM of the experiment with ``name``'s self-attention."""
    attention, mask = _attention(name, s)
    vocab = task(s).vocab_size
    return TransformerLM(vocab, dim=s.dim, num_heads=s.heads, num_layers=s.layers, causal=True, dropout=0.0,
                         norm_first=True, attention=attention, attention_mask=mask, max_len=s.length)


def train_recall(name: str, seed: int, *, scale: str = "default", progress=None) -> Result:
    """Train ``name`` at ``scale`` for one seed at one thread; the test accuracy over the queries."""
    if scale not in SETTINGS:
        raise ArgumentError(f"recall experiment: scale must be one of {sorted(SETTINGS)}; got {scale!r}")
    s = SETTINGS[scale]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            the_task, model, objective = task(s), build(name, s), MQARObjective()
            eval_batch = the_task.sample(s.budget.eval_size, torch.Generator().manual_seed(seed + _EVAL_SEED))
            trained = fit(model, the_task, objective, s.budget, generator=torch.Generator().manual_seed(seed),
                          eval_batch=eval_batch, evals=4, progress=progress)
            test = the_task.sample(s.budget.test_size, torch.Generator().manual_seed(seed + _TEST_SEED))
            accuracy = evaluate(model, objective, test, the_task)
    finally:
        torch.set_num_threads(threads)
    return Result(f"{TASK}/{name}", TASK, name, seed, accuracy, trained.seconds, trained.peak_bytes,
                  count_parameters(model), trained.curve, extra={"length": s.length, "gap": s.gap})


def holds(accuracy: dict[str, list[float]]) -> tuple[bool | None, list[str]]:
    """:data:`CLAIM` against per-seed accuracies by mechanism: every seed of each better mechanism above every
    seed of the window (None: a mechanism was not measured), and what failed."""
    missing = [m for m in (*CLAIM.better, *CLAIM.worse) if not accuracy.get(m)]
    if missing:
        return None, [f"not measured: {', '.join(missing)}"]
    failures = [f"{b} (worst seed {min(accuracy[b]):.3f}) not above {w} (best seed {max(accuracy[w]):.3f})"
                for b in CLAIM.better for w in CLAIM.worse if not min(accuracy[b]) > max(accuracy[w])]
    return not failures, failures
