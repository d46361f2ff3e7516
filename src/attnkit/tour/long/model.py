"""The long-range suite's model: one encoder classifier with the attention swapped in, at matched parameter count.

:class:`LongClassifier` (Tay et al. 2020, arXiv:2011.04006, Sec. 3: the same encoder for every
mechanism): ``x = E[tokens] sqrt(d) + PE`` (sinusoidal, no parameters), ``N`` pre-norm
:class:`~attnkit.models.TransformerEncoder` blocks with the mechanism's self-attention, mean
pooling over the real (non-padding, id != 0) positions, a linear head. The Perceiver replaces the
blocks by a :class:`~attnkit.nn.perceiver.PerceiverEncoder` (latents cross-attend to the input, then
``N - 1`` latent blocks) and pools its latents.

Padding is never masked inside the attention (most long-sequence modules take no key mask), the
same for every mechanism; pooling skips it. :func:`build` picks the feed-forward width that brings
each mechanism's parameter count closest to dense softmax's (:func:`matched_ff_dim`).

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

__all__ = ["LongClassifier", "build", "matched_ff_dim", "LATENTS"]

LATENTS = 32  # the Perceiver's latent array: N x dim


class LongClassifier(nn.Module):
    """Encoder classifier over token ids with any roster mechanism (see the module docstring).

    Args:
        vocab_size, num_classes: input ids and classes.
        sizes: length, width, heads (and image side) of the suite.
        layers: encoder blocks.
        ff_dim: feed-forward width of each block (unused by the Perceiver, whose MLPs are ``4 dim``).
        name: the roster mechanism.
    """

    def __init__(self, vocab_size: int, num_classes: int, sizes: Sizes, *, layers: int, ff_dim: int, name: str):
        super().__init__()
        mech = mechanism(name)
        factory = mech.factory(sizes)
        self.mechanism = name
        self.embed = TokenEmbedding("LongClassifier", vocab_size, dim=sizes.dim, positional="sinusoidal",
                                    max_len=sizes.length, dropout=0.0)
        if factory is None:
            self.body = PerceiverEncoder(sizes.dim, num_latents=LATENTS, latent_dim=sizes.dim, depth=layers - 1,
                                         latent_heads=sizes.heads, head_dim=sizes.dim // sizes.heads)
        else:
            self.body = TransformerEncoder(sizes.dim, sizes.heads, layers, ff_dim=ff_dim, norm_first=True,
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


def _count(vocab_size, num_classes, sizes, layers, ff_dim, name) -> int:
    with torch.random.fork_rng(devices=[]):
        return count_parameters(LongClassifier(vocab_size, num_classes, sizes, layers=layers, ff_dim=ff_dim,
                                               name=name))


@lru_cache(maxsize=256)
def matched_ff_dim(vocab_size: int, num_classes: int, sizes: Sizes, layers: int, name: str) -> int:
    """The feed-forward width (>= 1) that brings ``name``'s parameter count closest to softmax's at ``4 dim``.

    The count is linear in the width, so two counts give the slope; the Perceiver keeps its own.
    """
    target = _count(vocab_size, num_classes, sizes, layers, 4 * sizes.dim, "softmax")
    if name == "softmax" or mechanism(name).build is None:
        return 4 * sizes.dim
    one = _count(vocab_size, num_classes, sizes, layers, 1, name)
    slope = _count(vocab_size, num_classes, sizes, layers, 2, name) - one
    return max(1, 1 + round((target - one) / slope))


def build(vocab_size: int, num_classes: int, sizes: Sizes, *, layers: int, name: str) -> LongClassifier:
    """``name``'s :class:`LongClassifier` at the parameter count of dense softmax's (from the global RNG)."""
    ff_dim = matched_ff_dim(vocab_size, num_classes, sizes, layers, name)
    return LongClassifier(vocab_size, num_classes, sizes, layers=layers, ff_dim=ff_dim, name=name)
