"""The MAD battery: every causal token-mixing mechanism of the library on MAD's six tasks, one table.

Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid Architectures" (ICML 2024, arXiv:2403.17844),
Sec. 3-4: in-context, fuzzy and noisy recall, selective copying, compression and memorization
(:data:`attnkit.lab.tasks.mad.MAD_TASKS`, the paper's easiest setting of each) score a mechanism in
a 2-layer model, and the mean over the tasks predicts how it scales (their Fig. 1). Here each
mechanism of :data:`MECHANISMS` is the token mixer of the same 2-layer causal pre-norm language model
(:func:`~.tokens.language_model`, width 64, 2 heads) with the same budget; the hybrids alternate a
recurrent layer with a softmax layer (``TransformerLM(softmax_every=2)``). The report's
section (:mod:`attnkit.lab.tour.report.mad`) draws the task x mechanism table with the mean and checks
:data:`CLAIM`. Experiment keys are ``mad_<task>/<mechanism>`` (:data:`KEYS`): ``attnkit tour --suite mad``.
"""

from __future__ import annotations

from functools import partial

from .... import masks
from ....models import TransformerLM
from ... import tasks
from ...tasks.mad import MAD_TASKS
from . import Built, Experiment
from .tokens import TokenObjective
from .train import Budget

__all__ = ["MECHANISMS", "USES", "CLAIM", "WINDOW", "mad_experiments", "KEYS", "task_name"]

WINDOW = 16
DIM, HEADS, LAYERS = 64, 2, 2

# name -> (the attention of the model, further TransformerLM options, what it is)
MECHANISMS = {
    "softmax": ("softmax", {}, "softmax attention (Vaswani et al. 2017)"),
    "window": ("softmax", {"attention_mask": masks.sliding_window(WINDOW, 0)},
               f"softmax attention over the last {WINDOW} tokens (a sliding window)"),
    "linear": ("linear-attention", {}, "linear attention (Katharopoulos et al. 2020)"),
    "performer": ("performer", {}, "Performer's random features (Choromanski et al. 2021)"),
    "retnet": ("retnet", {}, "RetNet's retention (Sun et al. 2023): a fixed decay per head"),
    "gla": ("gla", {}, "gated linear attention (Yang et al. 2023)"),
    "mamba2": ("mamba2", {}, "Mamba-2's mixer (Dao & Gu 2024)"),
    "deltanet": ("deltanet", {}, "DeltaNet (Yang et al. 2024): the delta rule"),
    "gated-deltanet": ("gated-deltanet", {}, "Gated DeltaNet (Yang et al. 2024)"),
    "kda": ("kimi-delta-attention", {}, "Kimi Delta Attention (Kimi Linear 2025): a gate per channel"),
    "hybrid-gdn": ("gated-deltanet", {"softmax_every": 2},
                   "hybrid: a Gated DeltaNet layer then a softmax layer (Qwen3-Next's mix, in small)"),
    "hybrid-mamba2": ("mamba2", {"softmax_every": 2}, "hybrid: a Mamba-2 layer then a softmax layer (as Jamba)"),
}
_SOFTMAX = ("multi-head", "scaled-dot-product")
USES = {"softmax": _SOFTMAX, "window": (*_SOFTMAX, "sliding-window"), "linear": ("linear-attention",),
        "performer": ("performer",), "retnet": ("retnet",), "gla": ("gla",), "mamba2": ("mamba2",),
        "deltanet": ("deltanet",), "gated-deltanet": ("gated-deltanet",), "kda": ("kimi-delta-attention",),
        "hybrid-gdn": ("gated-deltanet", *_SOFTMAX), "hybrid-mamba2": ("mamba2", *_SOFTMAX)}
CLAIM = {"statement": "softmax attention reaches at least 90 % on in-context recall at MAD's easiest setting "
                      "(vocabulary 16, length 128)",
         "source": "Poli et al. 2024, arXiv:2403.17844, Sec. 4.1 (attention solves the recall tasks)",
         "task": "mad_in_context_recall", "mechanism": "softmax", "level": 0.9}


def task_name(task: str) -> str:
    """The tour's task name of a MAD task (``mad_<task>``)."""
    return f"mad_{task}"


def _build(task: str, mechanism: str) -> Built:
    data = tasks.get(task, **MAD_TASKS[task])
    attention, options, _ = MECHANISMS[mechanism]
    model = TransformerLM(data.vocab_size, dim=DIM, num_heads=HEADS, num_layers=LAYERS, causal=True, dropout=0.0,
                          norm_first=True, attention=attention, max_len=data.seq_len, **options)
    return Built(model, data, data, TokenObjective())


def mad_experiments() -> list[Experiment]:
    """One experiment per MAD task and mechanism (:data:`KEYS`), one budget for all."""
    budget, quick = Budget(steps=300, lr=3e-3, test_size=512), Budget(steps=100, lr=3e-3, test_size=256)
    return [Experiment(task_name(task), name, f"MAD {task} ({tasks.get(task, **sizes).describe()}); 2-layer causal "
                       f"pre-norm LM, width {DIM}: {text}", partial(_build, task, name), budget, quick,
                       uses=("causal", "sinusoidal-positional-encoding", *USES[name]))
            for task, sizes in MAD_TASKS.items() for name, (_, _, text) in MECHANISMS.items()]


KEYS = tuple(f"{task_name(task)}/{name}" for task in MAD_TASKS for name in MECHANISMS)
