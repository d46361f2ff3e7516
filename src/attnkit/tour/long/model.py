"""The long-range suite's model: one encoder classifier with the attention swapped in, at matched parameter count.

:class:`LongClassifier` (Tay et al. 2020, arXiv:2011.04006, Sec. 3: the same encoder for every
mechanism): ``x = E[tokens] sqrt(d) + PE`` (sinusoidal, no parameters), ``N`` pre-norm
:class:`~attnkit.models.TransformerEncoder` blocks with the mechanism's self-attention, mean
pooling over the real (non-padding, id != 0) positions, a linear head. The Perceiver replaces the
blocks by a :class:`~attnkit.nn.perceiver.PerceiverEncoder` (latents cross-attend to the input, then
``N - 1`` latent blocks) and pools its latents.

Padding is never masked inside the attention (most long-sequence modules take no key mask), the
same for every mechanism; pooling skips it. :func:`build` matches each mechanism's parameter count
to dense softmax's (:func:`matched_width`): the feed-forward width of the blocks absorbs what the
mechanism adds or saves (Longformer's global projections, Linformer's ``k x L`` sequence
projection, the Lambda layer's smaller projections), and the Perceiver's number of latents does
(its MLPs are ``4 dim`` wide).

Shapes: ``inputs`` ``(B, L)`` int64 ids (0 = padding) -> logits ``(B, num_classes)``.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch import nn

from ...models import TransformerEncoder
from ...models.tokens import TokenEmbedding
from ...nn.perceiver import PerceiverEncoder
from ..experiments.train import count_parameters
from .roster import Sizes, mechanism

__all__ = ["LongClassifier", "build", "matched_width", "MIN_LATENTS", "TOLERANCE"]

MIN_LATENTS = 8  # the Perceiver's latent array is N x dim, N >= this
TOLERANCE = 0.02  # every mechanism's parameter count is within 2 % of dense softmax's (tests check it)


class LongClassifier(nn.Module):
    """Encoder classifier over token ids with any roster mechanism (see the module docstring).

    Args:
        vocab_size, num_classes: input ids and classes.
        sizes: length, width, heads (and image side) of the suite.
        layers: encoder blocks.
        width: the feed-forward width of each block, or the Perceiver's number of latents.
        name: the roster mechanism.
    """

    def __init__(self, vocab_size: int, num_classes: int, sizes: Sizes, *, layers: int, width: int, name: str):
        super().__init__()
        mech = mechanism(name)
        factory = mech.factory(sizes)
        self.mechanism = name
        self.embed = TokenEmbedding("LongClassifier", vocab_size, dim=sizes.dim, positional="sinusoidal",
                                    max_len=sizes.length, dropout=0.0)
        if factory is None:
            self.body = PerceiverEncoder(sizes.dim, num_latents=width, latent_dim=sizes.dim, depth=layers - 1,
                                         latent_heads=sizes.heads, head_dim=sizes.dim // sizes.heads)
        else:
            self.body = TransformerEncoder(sizes.dim, sizes.heads, layers, ff_dim=width, norm_first=True,
                                           attention=factory, max_len=sizes.length)
        self.head = nn.Linear(sizes.dim, num_classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        x = self.embed(inputs)  # (B, L, dim)
        keep = inputs != 0  # (B, L)
        if isinstance(self.body, PerceiverEncoder):
            pooled = self.body(x, input_keep_mask=keep).mean(1)  # (B, N, dim) -> (B, dim)
        else:
            h = self.body(x)
            pooled = (h * keep[..., None]).sum(1) / keep.sum(1, keepdim=True).clamp(min=1)
        return self.head(pooled)


def _count(vocab_size, num_classes, sizes, layers, width, name) -> int:
    with torch.random.fork_rng(devices=[]):
        return count_parameters(LongClassifier(vocab_size, num_classes, sizes, layers=layers, width=width, name=name))


@lru_cache(maxsize=256)
def matched_width(vocab_size: int, num_classes: int, sizes: Sizes, layers: int, name: str) -> int:
    """The width (see :class:`LongClassifier`) that brings ``name``'s parameter count closest to softmax's at ``4 dim``.

    The count is linear in the width, so two counts give the slope. Softmax itself: ``4 dim``.
    """
    target = _count(vocab_size, num_classes, sizes, layers, 4 * sizes.dim, "softmax")
    if name == "softmax":
        return 4 * sizes.dim
    low = MIN_LATENTS if mechanism(name).build is None else 1
    one = _count(vocab_size, num_classes, sizes, layers, low, name)
    slope = _count(vocab_size, num_classes, sizes, layers, low + 1, name) - one
    return max(low, low + round((target - one) / slope))


def build(vocab_size: int, num_classes: int, sizes: Sizes, *, layers: int, name: str) -> LongClassifier:
    """``name``'s :class:`LongClassifier` at the parameter count of dense softmax's (from the global RNG)."""
    width = matched_width(vocab_size, num_classes, sizes, layers, name)
    return LongClassifier(vocab_size, num_classes, sizes, layers=layers, width=width, name=name)
