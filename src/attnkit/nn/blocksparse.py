"""Block-sparse self-attention: a block layout (or any attnkit mask) says which blocks are computed."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core import attention
from ..costing.attend import ATTENTION_FORMULA, projections
from ..costing.tally import dtype_of
from ..errors import ArgumentError, DTypeError, ShapeError, check_int
from ..masks.base import Mask
from ..registry.entry import Entry, register
from ._projections import ProjectedAttention, count_self_attention, projected_spec

__all__ = ["BlockPattern", "BlockSparseAttention"]


class BlockPattern(Mask):
    """Query block ``I`` may attend key block ``J`` where ``layout[..., I, J]`` (True = attend).

    Same predicate as :func:`attnkit.masks.block_layout`, but its block layout for any
    kernel block size is computed exactly from rectangle sums of ``layout`` in
    ``O(nq nk)``, without evaluating the ``Lq x Lk`` predicate: the layout can be
    built anew on every call (BigBird's random blocks) at no quadratic cost.
    Positions beyond the layout's extent attend to nothing.

    Args:
        layout: bool ``(nq, nk)``, ``(H, nq, nk)`` or ``(B, H, nq, nk)``.
        block_size: tokens per layout block.
    """

    def __init__(self, layout: torch.Tensor, block_size: int):
        if not isinstance(layout, torch.Tensor) or layout.dtype != torch.bool:
            got = layout.dtype if isinstance(layout, torch.Tensor) else type(layout).__name__
            raise DTypeError(f"BlockPattern: layout must be a bool tensor (True = attend); got {got}")
        if not 2 <= layout.dim() <= 4:
            raise ShapeError(f"BlockPattern: layout must have shape (nq, nk), (H, nq, nk) or (B, H, nq, nk); "
                             f"got {tuple(layout.shape)}")
        self.layout = layout.reshape((1,) * (4 - layout.dim()) + tuple(layout.shape))
        self.block_size = check_int("BlockPattern", "block_size", block_size, 1)
        batch, heads = self.layout.shape[:2]
        self.uses = frozenset({"q", "kv"} | ({"b"} if batch > 1 else set()) | ({"h"} if heads > 1 else set()))
        self.batch_size = batch if batch > 1 else None
        self.num_heads = heads if heads > 1 else None

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        lay = self.layout.to(q_idx.device)
        qb, kb = q_idx // self.block_size, kv_idx // self.block_size
        inside = (qb < lay.shape[2]) & (kb < lay.shape[3])
        b = b if lay.shape[0] > 1 else torch.zeros_like(b)
        h = h if lay.shape[1] > 1 else torch.zeros_like(h)
        return inside & lay[b, h, qb.clamp(max=lay.shape[2] - 1), kb.clamp(max=lay.shape[3] - 1)]

    def _ranges(self, length, bs, extent, device):
        """Per kernel block: first and last layout block it overlaps, and whether it runs past the layout."""
        first = torch.arange(0, length, bs, device=device)
        last = torch.clamp(first + bs - 1, max=length - 1)
        beyond = last // self.block_size >= extent
        return (first // self.block_size).clamp(max=extent), (last // self.block_size).clamp(max=extent - 1), beyond

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        lay = self.layout.to(device)
        sums = F.pad(lay.to(torch.int64).cumsum(2).cumsum(3), (1, 0, 1, 0))  # (B, H, nq+1, nk+1) prefix sums
        r0, r1, q_beyond = self._ranges(q_len, bs, lay.shape[2], device)
        c0, c1, k_beyond = self._ranges(kv_len, bs, lay.shape[3], device)
        at = lambda r, c: sums[:, :, r[:, None], c[None, :]]
        count = at(r1 + 1, c1 + 1) - at(r0, c1 + 1) - at(r1 + 1, c0) + at(r0, c0)  # allowed layout blocks
        area = (r1 - r0 + 1).clamp(min=0)[:, None] * (c1 - c0 + 1).clamp(min=0)[None, :]
        full = (count == area) & ~q_beyond[:, None] & ~k_beyond[None, :]
        return count > 0, full

    def __repr__(self):
        return f"BlockPattern(shape={tuple(self.layout.shape)}, block_size={self.block_size})"


class BlockSparseAttention(ProjectedAttention):
    """Multi-head self-attention restricted to a block-sparse pattern.

    Child et al. 2019, arXiv:1904.10509, Sec. 5.5 (block-sparse attention kernels; Gray,
    Radford & Kingma 2017, "GPU kernels for block-sparse weights"): the scores are computed
    only in the (query block, key block) pairs a layout marks, i.e. eq. 2-3 of the paper,
    ``a(x_i, S_i) = softmax(Q_i K_{S_i}^T / sqrt(d)) V_{S_i}``, with ``S_i`` the union of the
    key blocks of query ``i``'s block.

    Notation: ``S_i`` = the keys allowed to query ``i``; ``x`` = the input; ``d`` = head width.

    Differences from the paper: none in the function computed. The core's block-sparse kernel
    runs on CPU/any device in PyTorch (no custom GPU kernel); it picks its own block size (64
    or 128) and the layout is converted to it exactly (:class:`BlockPattern`).

    Shapes:
        ``x`` ``(B, n, dim)`` -> ``(B, n, dim)``.

    Complexity:
        ``O(B H n w D)`` time and ``O(B H n w)`` memory for ``w`` computed keys per query
        (block density times ``n``), plus ``O(B n dim^2)`` for the projections.

    Args:
        dim: model width.
        num_heads: number of heads (``dim % num_heads == 0``).
        pattern: a bool layout ``(nq, nk)``, ``(H, nq, nk)`` or ``(B, H, nq, nk)`` (True = attend; needs
            ``block_size``), or any :mod:`attnkit.masks` mask (then no ``block_size``).
        block_size: tokens per layout block.
        dropout: on the weights, training only.
        bias: projections with bias.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layout = torch.eye(4, dtype=torch.bool) | torch.eye(4, dtype=torch.bool).roll(1, 0)
        >>> layer = BlockSparseAttention(16, 2, layout, block_size=3)
        >>> layer(torch.randn(2, 11, 16)).shape
        torch.Size([2, 11, 16])
    """

    def __init__(self, dim: int, num_heads: int, pattern, *, block_size: int | None = None,
                 dropout: float = 0.0, bias: bool = True):
        super().__init__(dim, num_heads, dropout=dropout, bias=bias)
        if isinstance(pattern, Mask):
            if block_size is not None:
                raise ArgumentError("BlockSparseAttention: block_size applies to a layout tensor, not to a mask; "
                                    f"got block_size={block_size!r} with {pattern!r}")
            self.pattern = pattern
        elif isinstance(pattern, torch.Tensor):
            if block_size is None:
                raise ArgumentError("BlockSparseAttention: a layout tensor needs block_size; got None")
            self.pattern = BlockPattern(pattern.detach().cpu(), block_size)
        else:
            raise DTypeError(f"BlockSparseAttention: pattern must be a bool layout tensor or an attnkit mask; "
                             f"got {type(pattern).__name__}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        if isinstance(self.pattern, BlockPattern):
            blocks, size = self.pattern.layout.shape[2], self.pattern.block_size
            if x.shape[1] > blocks * size:
                raise ShapeError(f"BlockSparseAttention: the layout covers {blocks * size} positions "
                                 f"({blocks} blocks of {size}); got n={x.shape[1]}")
        q, k, v = self.project(x)  # (B, H, n, D) each
        return self.merge_heads(attention(q, k, v, mask=self.pattern, dropout_p=self.dropout_p))


def _example():
    g = torch.Generator().manual_seed(0)
    layout = torch.rand(4, 4, generator=g) < 0.5
    layout |= torch.eye(4, dtype=torch.bool)
    return BlockSparseAttention(16, 2, layout, block_size=4), (torch.randn(2, 14, 16, generator=g),)


def _make(s):
    nb = -(-s["length"] // s["block_size"])
    if s["layout"] == "random":
        layout = torch.rand(nb, nb, generator=torch.Generator().manual_seed(s["seed"])) < s["density"]
        layout |= torch.eye(nb, dtype=torch.bool)
    else:  # a band of `band` blocks on each side and the first `columns` block columns
        idx = torch.arange(nb)
        layout = (idx[:, None] - idx[None, :]).abs() <= s["band"]
        layout[:, :s["columns"]] = True
    return BlockSparseAttention(s["dim"], s["heads"], layout, block_size=s["block_size"]).to(dtype_of(s))


def _count(t, s, module):
    projections(t, s)
    count_self_attention(t, "", s, module, module.pattern)


register(Entry("block-sparse", BlockSparseAttention, "Child et al. 2019, arXiv:1904.10509, Sec. 5.5",
               "O(L w D), w = computed keys per query", "attention only in the blocks a layout or mask allows",
               "long-sequence", _example,
               spec=projected_spec(BlockSparseAttention, _count, ATTENTION_FORMULA, make=_make,
                                   sizes={"length": 14, "block_size": 4, "layout": "random", "density": 0.5, "seed": 0,
                                          "band": 1, "columns": 1})))
