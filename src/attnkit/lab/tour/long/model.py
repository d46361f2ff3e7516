"""The long-range suite's model: one encoder with the attention swapped in, at matched parameter count.

:class:`LongClassifier` (Tay et al. 2020, arXiv:2011.04006, Sec. 3: the same encoder for every
mechanism): ``x = E[tokens] sqrt(d) + PE`` (sinusoidal, no parameters), ``N`` pre-norm
:class:`~attnkit.models.TransformerEncoder` blocks with the mechanism's self-attention, then a
linear head: on every position (a task labelled per position) or on the mean over the real
(non-padding, id != 0) positions (one label per sequence). The Perceiver replaces the blocks by a
:class:`~attnkit.nn.perceiver.PerceiverEncoder` (latents cross-attend to the input, then ``N - 1``
latent blocks); one label comes from the mean of its latents, a label per position from a
cross-attention of each position to the latents (Perceiver IO's decoder, Jaegle et al. 2022,
arXiv:2107.14795, Sec. 2: the output queries are the input embeddings).

Padding is never masked inside the attention (most long-sequence modules take no key mask), the
same for every mechanism; pooling skips it. :func:`build` matches each mechanism's parameter count
to dense softmax's (:func:`matched_width`): the feed-forward width of the blocks absorbs what the
mechanism adds or saves (Longformer's global projections, Linformer's ``k x L`` sequence
projection, the Lambda layer's smaller projections), and the Perceiver's number of latents does
(its MLPs are ``4 dim`` wide).

Shapes: ``inputs`` ``(B, L)`` int64 ids (0 = padding) -> logits ``(B, num_classes)``, or
``(B, L, num_classes)`` with ``per_position``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import torch
from torch import nn

from ....models import TransformerEncoder
from ....models.tokens import TokenEmbedding
from ....nn.perceiver import PerceiverAttention, PerceiverEncoder
from ..experiments.train import count_parameters
from .roster import GlobalTokens, Sizes, mechanism

__all__ = ["LongClassifier", "build", "matched_width", "MIN_LATENTS", "TOLERANCE", "USES"]

MIN_LATENTS = 8  # the Perceiver's latent array is N x dim, N >= this
TOLERANCE = 0.02  # every mechanism's parameter count is within 2 % of dense softmax's (tests check it)
USES = ("sinusoidal-positional-encoding",)  # the registry entries of the model around the attention


class LongClassifier(nn.Module):
    """Encoder over token ids with any roster mechanism, one label per sequence or per position (module docstring).

    Args:
        vocab_size, num_classes: input ids and classes.
        sizes: length, width, heads (and image side) of the task.
        layers: encoder blocks.
        width: the feed-forward width of each block, or the Perceiver's number of latents.
        name: the roster mechanism.
        per_position: logits at every position instead of one per sequence.
        questions: the task's :meth:`~attnkit.lab.tasks.Task.question_positions` (ids ``(B, L)`` -> bool
            ``(B, L)`` or None): where a mechanism with global tokens puts them, read afresh for each batch.
    """

    def __init__(self, vocab_size: int, num_classes: int, sizes: Sizes, *, layers: int, width: int, name: str,
                 per_position: bool = False, questions: Callable[[torch.Tensor], torch.Tensor | None] | None = None):
        super().__init__()
        self.questions = questions
        factory = mechanism(name).factory(sizes)
        self.mechanism, self.per_position = name, per_position
        self.embed = TokenEmbedding("LongClassifier", vocab_size, dim=sizes.dim, positional="sinusoidal",
                                    max_len=sizes.length, dropout=0.0)
        head_dim = sizes.dim // sizes.heads
        if factory is None:
            self.body = PerceiverEncoder(sizes.dim, num_latents=width, latent_dim=sizes.dim, depth=layers - 1,
                                         latent_heads=sizes.heads, head_dim=head_dim)
            self.decoder = nn.ModuleList([nn.LayerNorm(sizes.dim), PerceiverAttention(
                sizes.dim, num_heads=sizes.heads, head_dim=head_dim)]) if per_position else None
        else:
            self.body = TransformerEncoder(sizes.dim, sizes.heads, layers, ff_dim=width, norm_first=True,
                                           attention=factory, max_len=sizes.length)
        self.head = nn.Linear(sizes.dim, num_classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self.embed(inputs)  # (B, L, dim)
        keep = inputs != 0  # (B, L)
        if isinstance(self.body, PerceiverEncoder):
            latents = self.body(x, input_keep_mask=keep)  # (B, N, dim)
            if not self.per_position:
                return self.head(latents.mean(1))
            norm, cross = self.decoder
            return self.head(x + cross(norm(x), latents))  # (B, L, C): each position reads the latents
        if self.questions is not None:
            where = self.questions(inputs)  # (B, L) bool or None
            for layer in self.body.modules():
                if isinstance(layer, GlobalTokens):
                    layer.questions = where
        h = self.body(x)
        if self.per_position:
            return self.head(h)
        pooled = (h * keep[..., None]).sum(1) / keep.sum(1, keepdim=True).clamp(min=1)
        return self.head(pooled)


def _count(vocab_size, num_classes, sizes, layers, width, name, per_position) -> int:
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        model = LongClassifier(vocab_size, num_classes, sizes, layers=layers, width=width, name=name,
                               per_position=per_position)
    return count_parameters(model)


@lru_cache(maxsize=512)
def matched_width(vocab_size: int, num_classes: int, sizes: Sizes, layers: int, ff: int, name: str,
                  per_position: bool = False) -> int:
    """The width (see :class:`LongClassifier`) that brings ``name``'s parameter count closest to softmax's at ``ff``.

    The count is linear in the width, so two counts give the slope. Softmax itself: ``ff``.
    """
    if name == "softmax":
        return ff
    target = _count(vocab_size, num_classes, sizes, layers, ff, "softmax", per_position)
    low = MIN_LATENTS if mechanism(name).build is None else 1
    one = _count(vocab_size, num_classes, sizes, layers, low, name, per_position)
    slope = _count(vocab_size, num_classes, sizes, layers, low + 1, name, per_position) - one
    return max(low, low + round((target - one) / slope))


def build(vocab_size: int, num_classes: int, sizes: Sizes, *, layers: int, ff: int, name: str,
          per_position: bool = False, questions=None) -> LongClassifier:
    """``name``'s :class:`LongClassifier` at the parameter count of dense softmax's with ``ff`` (global RNG);
    ``questions``: the task's question positions (see :class:`LongClassifier`)."""
    width = matched_width(vocab_size, num_classes, sizes, layers, ff, name, per_position)
    return LongClassifier(vocab_size, num_classes, sizes, layers=layers, width=width, name=name,
                          per_position=per_position, questions=questions)
