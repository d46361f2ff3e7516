"""A self-attention module for sequence-parallel models: the models' softmax attention on sequence shards.

:class:`SequenceParallelSelfAttention` is :class:`~attnkit.models.self_attention.SoftmaxSelfAttention`
(same parameters and state_dict keys) whose forward takes this rank's shard ``(B, L/W, dim)``
of the sequence and attends over the whole sequence with :func:`attnkit.distributed.attention`.
A model gets it through its ``attention=`` factory, so ``attnkit.models`` needs no
knowledge of process groups::

    factory = functools.partial(SequenceParallelSelfAttention, group=group, layout="zigzag")
    lm = TransformerLM(vocab, positional=None, attention=factory)     # every rank: same parameters
    logits_shard = lm(sp.shard(tokens, dim=1, layout="zigzag"))          # (B, L/W, vocab)

Positions must come from the attention itself (``positional=None``; causal masks, or a
``bias`` such as ALiBi read at global positions): the models' positional encodings add
``PE[0 : L/W]`` to every shard. The loss of the whole sequence is the sum of the ranks' shard
losses; parameter gradients are each rank's share, summed over ranks by DDP (which averages:
scale the loss by W) or by hand. No dropout on the weights and no KV cache (decode on one process).

Padded positions are inert, as in the one-process modules (docs/RELIABILITY.md, "Padding in
modules"): NaN or inf at a position ``key_keep_mask`` marks as padding is replaced by 0 before the
projections (:mod:`attnkit.nn.padding`), so it reaches no output at a real position and no gradient.
"""

from __future__ import annotations

import functools

import torch

from .. import masks
from ..errors import ArgumentError, DTypeError, ShapeError
from ..models.self_attention import SoftmaxSelfAttention
from ..nn._inputs import check_keep_mask, check_sequence
from ..nn.padding import clear_padding
from .agreement import Field, checked, size, text_of, tracked
from .api import plan, run
from .comm import Comm
from .layouts import check_layout, chunk_size, gathered

__all__ = ["SequenceParallelSelfAttention"]


class SequenceParallelSelfAttention(SoftmaxSelfAttention):
    """Multi-head softmax self-attention of a sequence shard against the whole sequence, across ``group``.

    Vaswani et al. 2017, arXiv:1706.03762, eq. 1, computed by :func:`attnkit.distributed.attention`
    (ring, Ulysses or all-gather). Differences from :class:`SoftmaxSelfAttention`: no rotary
    positions, no dropout, no KV cache; an optional score ``bias`` (modifier) read at global positions;
    NaN and inf at padded positions of ``x`` are replaced by 0 before the projections.

    Shapes: ``x`` ``(B, L/W, dim)``, ``key_keep_mask`` this rank's ``(B, L/W)`` -> ``(B, L/W, dim)``.

    Args:
        dim, num_heads: as :class:`SoftmaxSelfAttention`. causal: query i sees keys j <= i (global).
        mask: an attnkit mask for the global sequence, ANDed in. bias: a score modifier (e.g. ALiBi).
        scheme, layout, group: as :func:`attnkit.distributed.attention`.
    """

    def __init__(self, dim: int, num_heads: int, *, causal: bool = False, mask: masks.Mask | None = None,
                 bias=None, scheme: str = "ring", layout: str = "contiguous", group=None):
        super().__init__(dim, num_heads, causal=causal, mask=mask)
        self.bias, self.scheme, self.layout, self.group = bias, scheme, layout, group

    def forward(self, x: torch.Tensor, *, key_keep_mask: torch.Tensor | None = None, cache=None) -> torch.Tensor:
        comm = Comm(self.group)
        checked(comm, type(self).__name__, lambda: self._check(x, key_keep_mask, cache, comm.world),
                self._fields(x, key_keep_mask), device=getattr(x, "device", None))
        x = clear_padding(x, key_keep_mask)  # a padded key is also a padded query here: clear its row once
        q, k, v = self._project(x, x, x)  # (B, H, L/W, d) each
        parts = [masks.causal()] if self.causal else []
        parts += [self.pattern] if self.pattern is not None else []
        if key_keep_mask is not None:  # the keep mask of every position, from every rank's shard
            parts.append(masks.keys(gathered(key_keep_mask, 1, self.layout, comm)))  # (B, L)
        mask = functools.reduce(lambda a, b: a & b, parts) if parts else None
        setting = plan(q, k, v, mask=mask, bias=self.bias, scale=None, scheme=self.scheme, layout=self.layout,
                       world=comm.world)  # the same global data on every rank: the same plan, or the same error
        out = run(q, k, v, setting, comm, scheme=self.scheme, layout=self.layout, return_lse=False)
        return self.out_proj(out.transpose(1, 2).flatten(2))  # (B, H, L/W, d) -> (B, L/W, dim)

    def _check(self, x, key_keep_mask, cache, world: int) -> None:
        who = type(self).__name__
        if cache is not None:
            raise ArgumentError(f"{who}: no KV cache across ranks; decode on one process")
        check_sequence(who, "x", x, self.embed_dim, named=True, like=self)
        check_keep_mask(who, "key_keep_mask", key_keep_mask, *x.shape[:2])  # this rank's shard
        check_layout(self.layout)
        chunk_size(x.shape[1] * world, self.layout, world, "the global length L = W * x.shape[1]")

    def _fields(self, x, key_keep_mask) -> list[Field]:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        return [Field("the shard length (x.shape[1])", size(x, 1), ShapeError),
                Field("the shape of x", str(shape), ShapeError),
                Field("x.dtype", text_of(getattr(x, "dtype", None)), DTypeError),
                Field("whether a key_keep_mask is given", int(key_keep_mask is not None)),
                Field("the module", text_of(self)),
                tracked(x, *self.parameters())]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, scheme={self.scheme!r}, layout={self.layout!r}, bias={self.bias!r}"
