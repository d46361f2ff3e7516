"""The tour's catalogue: which registry entries each tour experiment exercises, and why the others are left out.

Every entry of :func:`attnkit.registry.entries` is either used by some experiment of the default
tour (:attr:`~attnkit.lab.tour.Experiment.uses`) or of the long-range suite (a roster mechanism's
:attr:`~attnkit.lab.tour.long.roster.Mechanism.uses` plus the suite model's own parts), or named in
:data:`LEFT_OUT` with the reason it is not trained; both reports show that list. A new registry
entry without either is reported by :func:`unexplained` and listed in the tour's report
(:func:`coverage_markdown`): the tour's coverage is a report of the lab, never a gate on the library.

Example:
    >>> from attnkit.lab.tour.catalogue import LEFT_OUT, unexplained, users
    >>> unexplained()
    []
    >>> "long: associative_recall/linear" in users()["linear-attention"]
    True
"""

from __future__ import annotations

__all__ = ["LEFT_OUT", "users", "unexplained", "coverage_markdown"]

_REPLACED = "is one option of the attention function; the tour trains each mechanism with its paper's choice, "

LEFT_OUT: dict[str, str] = {
    "alibi": "a position bias for extrapolating past the trained length; every tour task is trained and tested "
             "at one length, so it would show nothing that sinusoidal positions do not",
    "softcap": "soft-capping keeps large models' logits bounded (Gemma 2); the tour's small models never reach "
               "scores where it changes anything",
    "dilated-window": "a dilated window widens a sliding window's reach by skipping positions; the long suite's "
                      "sliding window and strided pattern already cover windows and strides",
    "prefix-lm": "a prefix language model's mask needs a generative prefix task; no tour task has one",
    "segment-level": "the mask of documents packed in one sequence; no tour task packs documents",
    "global-tokens": "the mask form of global tokens (one projection for every row); the long suite trains "
                     "Longformer's own module, whose global rows have projections of their own (Beltagy et al. "
                     "2020, Sec. 3.1)",
    "co-attention-alternating": "the alternating form of co-attention (Lu et al. 2016); the tour trains the "
                                "parallel form on the question task, and one form is enough to show the idea",
    "dot-product-module": "Luong's dot score as a module; the tour trains Luong's general score and Bahdanau's "
                          "additive one on dates, which include it as a special case",
    "lambda-layer": "the global lambda layer; the long suite trains the local lambda convolution (Bello 2021, "
                    "Sec. 4.3), the form the paper uses on images",
    "gumbel-softmax": "a relaxed sample for hard attention; the tour trains hard attention with REINFORCE "
                      "(Xu et al. 2015), the paper's estimator",
    "hard-argmax": _REPLACED + "and none uses an argmax normaliser",
    "sigmoid": _REPLACED + "and none uses sigmoid weights",
    "sparsemax": _REPLACED + "and none uses sparsemax weights",
    "cosine": _REPLACED + "and none uses cosine scores",
    "dot-product": _REPLACED + "and each uses the scaled dot product (Vaswani et al. 2017) or its own score",
    "learned-positional-embedding": "every tour model uses sinusoidal positions, the same for all mechanisms",
    "relative-position-bias": "every tour model uses sinusoidal positions, the same for all mechanisms",
    "lightning-attention": "MiniMax's linear layers: a fixed decay per head without a gate, as retention's; the recall "
                           "experiment trains GLA and Mamba-2, whose decays are gated",
    "rwkv4": "RWKV-4's fixed per-channel decay with no state beyond one number per channel; the recall experiment "
             "trains GLA and Mamba-2, whose gated matrix-valued states are what recall needs",
    "sigmoid-log-n": _REPLACED + "and none uses sigmoid weights (with or without the -log n bias)",
    "softpick": _REPLACED + "and none uses softpick's rectified softmax",
    "stick-breaking": _REPLACED + "and none uses stick-breaking weights",
    "delta-product": "DeltaProduct's products of reflections track states (rotations, permutations) that one "
                     "reflection per token cannot; the state-tracking experiment trains DeltaNet with one "
                     "reflection per token (negative eigenvalues), which parity already needs",
    "comba": "Comba's correction read at a scaled key of its own is a refinement of Gated DeltaNet, which the "
             "recall and state-tracking experiments train; at the tour's sizes it would train as Gated DeltaNet does",
    "rwkv7": "RWKV-7's generalized delta rule (a per-channel decay and a removal along its own key) is the delta "
             "rule the state-tracking experiment trains in DeltaNet and Gated DeltaNet; the tour leaves the RWKV "
             "block's token shift and low-rank gates to their own papers",
    "log-linear-mamba2": "log-linear attention grows the state with log L to help recall at long contexts; the "
                         "tour's recall experiment runs at one short length, where Mamba-2 with one state already "
                         "shows what a fixed state holds",
    "log-linear-gated-deltanet": "log-linear attention grows the state with log L to help recall at long contexts; "
                                 "the tour's recall experiment runs at one short length, where Gated DeltaNet "
                                 "already shows what a fixed state holds",
    "path-attention": "PaTH's data-dependent reflections of the keys are a learned position encoding; every tour "
                      "model uses sinusoidal positions, the same for all mechanisms",
    "forgetting-attention": "FoX's forget gate decays attention with distance, a recency prior learned per head; "
                            "the tour's tasks are trained at one length, where positions already tell the models "
                            "what a recency prior would",
    "dsa": "DeepSeek's lightning indexer picks top-k keys per query at 100k-token contexts; at the tour's lengths "
           "its selection keeps nearly every key, so it would train as dense attention does",
    "multi-head-latent": "latent attention changes what a decoder caches (attnkit cost --kv-cache), not what a model "
                         "can learn: at the tour's sizes it trains as multi-head attention",
    "qk-norm": "QK-norm keeps large models' logits from growing in training; the tour's small models never reach "
               "scores where it changes anything",
    "tiered-attention": "tiered attention over log sessions needs multi-session histories; the event-log task "
                        "has one session per sequence",
}
"""Registry name -> why no tour experiment trains it."""


def users() -> dict[str, list[str]]:
    """Registry name -> the tour experiments that use it (``"default: task/mechanism"``, ``"long: task/mechanism"``)."""
    from . import experiments
    from .long import model, suite
    from .long.roster import MECHANISMS

    found: dict[str, list[str]] = {}
    for key, exp in experiments().items():
        for name in getattr(exp, "uses", ()):  # an experiment that declares nothing uses nothing
            found.setdefault(name, []).append(f"default: {key}")
    for scale in suite.SCALES:
        for task, mech in suite.plan(scale).pairs:
            for name in (*MECHANISMS[mech].uses, *model.USES):
                label = f"long: {task}/{mech}"
                if label not in found.setdefault(name, []):
                    found[name].append(label)
    return found


def unexplained() -> list[str]:
    """The registry entries that no tour experiment uses and :data:`LEFT_OUT` does not explain."""
    from ... import registry

    used = users()
    return [e.name for e in registry.entries() if e.name not in used and e.name not in LEFT_OUT]


def coverage_markdown() -> list[str]:
    """The report's section on registry entries no experiment trains and no reason explains (none: no lines)."""
    missing = unexplained()
    if not missing:
        return []
    return ["## Registry entries the tour does not cover yet", "",
            *[f"- **{name}**: no experiment trains it and no reason is written" for name in missing], ""]
