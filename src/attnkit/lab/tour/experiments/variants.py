"""Attention's options on associative recall: each normaliser, score, score modifier, mask and the modules that
should train as dense softmax does, each against its paper's claim.

Every mechanism here is the token mixer of the same 2-layer causal pre-norm language model (width 64, 2 heads,
sinusoidal positions) on the tour's MQAR (:data:`~.catalog.MQAR`: 4 pairs of 16 keys, gap 8; guessing among the
values in context gives ~33 %), with one budget (:data:`BUDGET`); ``softmax`` is the baseline of every claim
(:data:`CLAIMS`, decided by :func:`.claims.decide`). :class:`OptionAttention` is a plain causal multi-head layer
whose score, normaliser, score modifier and mask are :func:`attnkit.attention`'s options; the controls use
their own modules (QK-norm through ``TransformerLM(qk_norm=True)``, :class:`~attnkit.nn.MultiHeadLatentAttention`,
:class:`~attnkit.nn.dsa.DSASparseAttention` with ``top_k`` below the length).

"Matches softmax" is an equivalence claim: held when the 95 % interval of the difference lies inside
+-:data:`MARGIN`. Experiment keys are ``mqar_variants/<mechanism>`` (:data:`KEYS`):
``attnkit tour --tasks mqar_variants``.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from .... import bias as biases
from .... import masks
from ....core import attention
from ....models import TransformerLM
from ....nn.dsa import DSASparseAttention
from ....nn.latent import MultiHeadLatentAttention
from ....nn.multihead import DotProductAttention
from ... import tasks
from . import Built, Experiment
from .claims import Claim
from .tokens import MQARObjective
from .train import Budget

__all__ = ["TASK", "MARGIN", "BUDGET", "QUICK", "OptionAttention", "MECHANISMS", "USES", "CLAIMS",
           "variant_experiments", "KEYS"]

TASK = "mqar_variants"
MQAR = {"num_pairs": 4, "num_keys": 16, "num_values": 16, "gap": 8}  # the tour's MQAR (catalog.MQAR)
LENGTH = 2 * MQAR["num_pairs"] + MQAR["gap"] + MQAR["num_pairs"]
DIM, HEADS = 64, 2
MARGIN = 0.1
WINDOW, DILATION = 4, 4
BUDGET, QUICK = Budget(steps=300, lr=3e-3), Budget(steps=150, lr=3e-3)


class OptionAttention(nn.Module):
    """Causal multi-head self-attention through :func:`attnkit.attention` with a chosen ``score``, ``normalize``,
    score modifier ``bias`` and extra ``mask`` (intersected with causal unless ``causal=False``: then ``mask``
    alone, e.g. a prefix LM's); ``inner``: a module computing
    ``inner(q, k, v, mask=...)`` instead (:class:`~attnkit.nn.multihead.DotProductAttention`).

    Shapes: ``x (B, n, dim)`` -> ``(B, n, dim)``.
    """

    def __init__(self, dim: int, num_heads: int, *, score: str = "scaled_dot", normalize: str = "softmax",
                 bias=None, mask: masks.Mask | None = None, causal: bool = True, inner: nn.Module | None = None):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.score, self.normalize, self.bias, self.inner = score, normalize, bias, inner
        self.mask = masks.causal() if mask is None else mask & masks.causal() if causal else mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.inner is not None:
            out = self.inner(q, k, v, mask=self.mask)
        else:
            out = attention(q, k, v, mask=self.mask, bias=self.bias, score=self.score, normalize=self.normalize)
        return self.out(out.transpose(1, 2).reshape(b, n, -1))


def _option(**options):
    def make(dim: int, num_heads: int) -> OptionAttention:
        extra = dict(options)
        if extra.get("inner") == "dot":
            extra["inner"] = DotProductAttention(scaled=False)
        return OptionAttention(dim, num_heads, **extra)
    return make


def _latent(dim: int, num_heads: int) -> MultiHeadLatentAttention:
    return MultiHeadLatentAttention(dim, num_heads, kv_lora_rank=dim // 2, qk_rope_head_dim=8,
                                    qk_nope_head_dim=dim // num_heads - 8)


def _dsa(dim: int, num_heads: int) -> DSASparseAttention:
    return DSASparseAttention(dim, num_heads, top_k=LENGTH // 2, index_heads=2, index_dim=16)


_QUERIES = list(range(LENGTH - MQAR["num_pairs"], LENGTH))  # where MQAR asks (Longformer's global positions)
# name -> (attention of TransformerLM, its options, what it is)
MECHANISMS: dict[str, tuple[object, dict, str]] = {
    "softmax": ("softmax", {}, "softmax attention, scaled dot product (Vaswani et al. 2017): the baseline"),
    "sigmoid": (_option(normalize="sigmoid"), {}, "elementwise sigmoid weights, no bias (Ramapuram et al. 2024)"),
    "sigmoid-log-n": (_option(normalize="sigmoid_log_n"), {}, "sigmoid(s - log n) weights (Ramapuram et al. 2024)"),
    "softpick": (_option(normalize="softpick"), {}, "softpick's rectified softmax (Zuhri et al. 2025)"),
    "stick-breaking": (_option(normalize="stick_breaking"), {}, "stick-breaking weights (Tan et al. 2024)"),
    "sparsemax": (_option(normalize="sparsemax"), {}, "sparsemax weights (Martins & Astudillo 2016)"),
    "hard-argmax": (_option(normalize="hard"), {}, "one-hot weights at the best key, straight-through gradient "
                    "(Xu et al. 2015's deterministic form)"),
    "gumbel-softmax": (_option(normalize="gumbel"), {}, "relaxed one-hot samples (Jang et al. 2017)"),
    "cosine": (_option(score="cosine"), {}, "softmax of scaled cosine similarities (Graves et al. 2014)"),
    "dot-product": (_option(inner="dot"), {}, "unscaled dot product through DotProductAttention(scaled=False) "
                    "(Luong et al. 2015)"),
    "softcap": (_option(bias=biases.softcap(5.0)), {}, "scores soft-capped at 5 (Gemma 2)"),
    "qk-norm": ("softmax", {"qk_norm": True}, "RMS-normalised queries and keys (Dehghani et al. 2023)"),
    "latent": (_latent, {}, "multi-head latent attention (DeepSeek-V2), latent rank 32, decoupled rotary 8"),
    "dsa": (_dsa, {}, f"DeepSeek sparse attention: the lightning indexer keeps {LENGTH // 2} of {LENGTH} keys"),
    "window": (_option(mask=masks.sliding_window(WINDOW, 0)), {}, f"a sliding window of {WINDOW}: every pair lies "
               "beyond its reach in two layers"),
    "dilated-window": (_option(mask=masks.dilated(WINDOW, DILATION)), {},
                       f"a window of {WINDOW} keys dilated by {DILATION} (Beltagy et al. 2020): reach "
                       f"{WINDOW * DILATION}"),
    "global-tokens": (_option(mask=masks.sliding_window(WINDOW, 0) | masks.global_tokens(_QUERIES)), {},
                      f"the window of {WINDOW} with the query positions global (Longformer's placement)"),
    "softmax-1layer": ("softmax", {"num_layers": 1}, "one causal softmax layer: cannot bind a value to its key"),
    "prefix-lm-1layer": (_option(mask=masks.prefix_lm(2 * MQAR["num_pairs"]), causal=False), {"num_layers": 1},
                         "one layer, the pairs a bidirectional prefix (Raffel et al. 2020's prefix LM)"),
}
_LM = ("sinusoidal-positional-encoding",)
_ATTN = (*_LM, "causal")
USES = {"softmax": (*_ATTN, "multi-head", "scaled-dot-product"), "sigmoid": (*_ATTN, "sigmoid"),
        "sigmoid-log-n": (*_ATTN, "sigmoid-log-n"), "softpick": (*_ATTN, "softpick"),
        "stick-breaking": (*_ATTN, "stick-breaking"), "sparsemax": (*_ATTN, "sparsemax"),
        "hard-argmax": (*_ATTN, "hard-argmax"), "gumbel-softmax": (*_ATTN, "gumbel-softmax"),
        "cosine": (*_ATTN, "cosine"), "dot-product": (*_ATTN, "dot-product", "dot-product-module"),
        "softcap": (*_ATTN, "softcap"), "qk-norm": (*_ATTN, "multi-head", "qk-norm"),
        "latent": (*_LM, "multi-head-latent"), "dsa": (*_LM, "dsa"), "window": (*_ATTN, "sliding-window"),
        "dilated-window": (*_ATTN, "dilated-window"), "global-tokens": (*_ATTN, "sliding-window", "global-tokens"),
        "softmax-1layer": (*_ATTN, "multi-head", "scaled-dot-product"), "prefix-lm-1layer": (*_LM, "prefix-lm")}


def _matches(name: str, statement: str, source: str) -> Claim:
    return Claim(f"{statement}: within {100 * MARGIN:.0f} points of softmax on MQAR", source, TASK, name, "softmax",
                 "within", MARGIN)


CLAIMS: tuple[Claim, ...] = (
    _matches("sigmoid-log-n", "sigmoid attention with the -log n bias matches softmax attention",
             "Ramapuram et al. 2024, arXiv:2409.04431 (abstract; Sec. 3, the bias b = -log n)"),
    Claim("without the -log n bias, sigmoid attention trains below softmax attention", "Ramapuram et al. 2024, "
          "arXiv:2409.04431 (the bias is what lets sigmoid attention match softmax)", TASK, "softmax", "sigmoid"),
    _matches("softpick", "softpick is a drop-in replacement for softmax with performance parity",
             "Zuhri et al. 2025, arXiv:2504.20966 (abstract)"),
    _matches("stick-breaking", "stick-breaking attention performs competitively with softmax",
             "Tan et al. 2024, arXiv:2410.17980 (abstract)"),
    _matches("sparsemax", "sparsemax attention performs on par with softmax while its weights are sparse",
             "Martins & Astudillo 2016, arXiv:1602.02068, Sec. 4.3"),
    _matches("hard-argmax", "deterministic hard attention learns where to look as soft attention does",
             "Xu et al. 2015, arXiv:1502.03044, Sec. 4.1, 5"),
    _matches("gumbel-softmax", "the Gumbel-softmax estimator trains a categorical choice as well as a soft one",
             "Jang et al. 2017, arXiv:1611.01144, Sec. 4"),
    _matches("cosine", "content addressing by cosine similarity retrieves by content as the dot product does",
             "Graves et al. 2014, arXiv:1410.5401, eq. 5-6"),
    _matches("dot-product", "at head width 32 the unscaled dot product trains as the scaled one (the scaling "
             "matters for large d_k)", "Vaswani et al. 2017, arXiv:1706.03762, Sec. 3.2.1; Luong et al. 2015"),
    _matches("softcap", "soft-capping the logits changes nothing while they stay small",
             "Gemma Team 2024, arXiv:2408.00118, Sec. 2"),
    _matches("qk-norm", "QK-norm trains as plain attention at small scale (it stabilises large models)",
             "Dehghani et al. 2023, arXiv:2302.05442, Sec. 2"),
    _matches("latent", "multi-head latent attention matches multi-head attention's quality with a smaller cache",
             "DeepSeek-AI 2024, arXiv:2405.04434, Sec. 2.1, Appendix D"),
    _matches("dsa", "DeepSeek sparse attention keeps dense attention's quality", "DeepSeek-AI 2025, "
             "arXiv:2512.02556, Sec. 2-3"),
    Claim("a dilated window reaches further than a plain window of as many keys: above the plain window on MQAR "
          "with every pair out of the plain window's reach", "Beltagy et al. 2020, arXiv:2004.05150, Sec. 3.1",
          TASK, "dilated-window", "window"),
    Claim("global attention on the task's question tokens lets a windowed model answer: above the window alone",
          "Beltagy et al. 2020, arXiv:2004.05150, Sec. 3.1", TASK, "global-tokens", "window"),
    Claim("a prefix LM's bidirectional prefix builds richer representations of the input: one layer with the "
          "pairs as prefix recalls above one causal layer", "Raffel et al. 2020, arXiv:1910.10683, Sec. 3.2.1",
          TASK, "prefix-lm-1layer", "softmax-1layer"),
)
"""The claims of this experiment (:func:`.claims.decide`)."""


def _build(mechanism: str) -> Built:
    task = tasks.MQAR(**MQAR)
    attn, options, _ = MECHANISMS[mechanism]
    options = dict(options)
    layers = options.pop("num_layers", 2)
    model = TransformerLM(task.vocab_size, dim=DIM, num_heads=HEADS, num_layers=layers, causal=True, dropout=0.0,
                          norm_first=True, attention=attn, max_len=task.seq_len, **options)
    return Built(model, task, task, MQARObjective())


def variant_experiments() -> list[Experiment]:
    """One experiment per mechanism of :data:`MECHANISMS`, keys ``mqar_variants/<mechanism>``."""
    head = (f"MQAR ({MQAR['num_pairs']} pairs of {MQAR['num_keys']} keys, gap {MQAR['gap']}), causal pre-norm LM, "
            f"width {DIM}, {HEADS} heads, 2 layers unless named")
    return [Experiment(TASK, name, f"{head}: {text}", partial(_build, name), BUDGET, QUICK, uses=USES[name])
            for name, (_, _, text) in MECHANISMS.items()]


KEYS = tuple(f"{TASK}/{name}" for name in MECHANISMS)
