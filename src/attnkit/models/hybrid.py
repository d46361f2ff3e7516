"""Hybrid stacks: linear-recurrent layers with a softmax attention layer every few layers.

Recent models interleave the two: Qwen3-Next and Kimi Linear put one softmax (full) attention layer
after every three linear ones (Gated DeltaNet, KDA), Jamba and Samba mix Mamba with attention. The
recurrent layers carry a constant-size state; the softmax layers keep exact recall over the
context. :func:`hybrid_attention` builds such a stack through the models' ``attention=`` factory;
``TransformerLM(attention=name, softmax_every=k)`` uses it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from torch import nn

from ..errors import ArgumentError, check_int
from ..nn import DeltaNet, GatedDeltaNet, GatedLinearAttention, KimiDeltaAttention, Mamba2Mixer, RetNetRetention
from .self_attention import SoftmaxSelfAttention

__all__ = ["RECURRENT", "hybrid_attention"]

# name -> builder(dim, num_heads); widths derived from the model's, defaults suited to small models.
RECURRENT: dict[str, Callable[[int, int], nn.Module]] = {
    "retnet": lambda d, h: RetNetRetention(d, h),
    "gla": lambda d, h: GatedLinearAttention(d, h),
    "mamba2": lambda d, h: Mamba2Mixer(d, head_dim=2 * d // h, state_dim=32),
    "deltanet": lambda d, h: DeltaNet(d, h),
    "gated-deltanet": lambda d, h: GatedDeltaNet(d, h),
    "kimi-delta-attention": lambda d, h: KimiDeltaAttention(d, h),
}


def hybrid_attention(linear: str, softmax_every: int | None = None, *,
                     dropout: float = 0.0) -> Callable[[int, int], nn.Module]:
    """A causal self-attention factory ``(dim, num_heads) -> nn.Module`` for a stack, called once per layer in order.

    Layer ``i`` (from 0) is causal :class:`SoftmaxSelfAttention` when ``(i + 1) % softmax_every == 0``,
    the linear-recurrent layer ``linear`` (a key of :data:`RECURRENT`) otherwise; ``softmax_every=None``
    makes every layer recurrent. ``softmax_every=4`` gives three linear layers to one softmax layer
    (Qwen3-Next, Kimi Linear). The factory counts its calls: build one per model.

    Example:
        >>> from attnkit.models import TransformerDecoder
        >>> stack = TransformerDecoder(12, 3, 4, cross=False, attention=hybrid_attention("gated-deltanet", 2))
        >>> [type(layer.self_attn).__name__ for layer in stack.layers]
        ['GatedDeltaNet', 'SoftmaxSelfAttention', 'GatedDeltaNet', 'SoftmaxSelfAttention']
    """
    if linear not in RECURRENT:
        raise ArgumentError(f"hybrid_attention: linear must be one of {', '.join(map(repr, RECURRENT))}; "
                            f"got {linear!r}")
    if softmax_every is not None:
        check_int("hybrid_attention", "softmax_every", softmax_every, 1)
    layers = itertools.count()

    def make(dim: int, num_heads: int) -> nn.Module:
        if softmax_every is not None and (next(layers) + 1) % softmax_every == 0:
            return SoftmaxSelfAttention(dim, num_heads, dropout=dropout, causal=True)
        return RECURRENT[linear](dim, num_heads)
    return make
