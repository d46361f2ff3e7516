"""BigBird attention (Zaheer et al. 2020): window + global + random blocks."""

from __future__ import annotations

import torch

from ..core import attention
from ..costing.attend import attend, projections
from ..costing.tally import dtype_of
from ..errors import ArgumentError, DTypeError, check_int
from ..registry.entry import Entry, register
from ._projections import ProjectedAttention, projected_spec
from .blocksparse import BlockPattern

__all__ = ["BigBirdAttention"]


class BigBirdAttention(ProjectedAttention):
    """Multi-head self-attention over BigBird's blocked window + global + random pattern (ITC).

    Zaheer et al. 2020, arXiv:2007.14062, eq. 1 (generalised attention over a graph ``D``),
    ``ATTN_D(X)_i = sum_h softmax(Q_h(x_i) K_h(X_N(i))^T / sqrt(d)) V_h(X_N(i))``, with the
    blocked pattern of Sec. 2 and App. D: the sequence is cut into blocks of ``b`` tokens;
    query block ``I`` sees key blocks ``|I - J| <= (w - 1) / 2`` (window), the ``g`` global
    blocks, and ``r`` random other blocks; the ``g`` global blocks see everything::

        b=1, w=3, g=1, r=1
        x x x x x x      <- global block: every key
        x x x . . x      <- window I-1..I+1, global 0, random 5
        x x x x x .      <- random 4
        x . x x x x      <- random 5

    Notation: ``N(i)`` = the keys query ``i`` sees; ``b, w, g, r`` = ``block_size,
    window_blocks, global_blocks, random_blocks``; ``d`` = head width.

    Differences from the paper: no residual ``x_i`` inside (add it in the layer); global
    tokens are the first ``g`` blocks of the sequence (ITC; the ETC variant's extra tokens are
    not implemented). Random blocks are drawn among the blocks a row does not already see,
    shared by all heads and batch elements, from ``generator`` when one is passed to
    :meth:`forward`, else from a generator seeded with ``seed`` (so the pattern is a fixed
    function of ``n``): results are reproducible. Any ``n`` (the last block may be shorter).

    Shapes:
        ``x`` ``(B, n, dim)`` -> ``(B, n, dim)``.

    Complexity:
        ``O(B H n (w + g + r) b d)`` time and ``O(B H n (w + g + r) b)`` memory, plus
        ``O(B H g b n d)`` for the global rows and ``O(B n dim^2)`` for the projections.

    Args:
        dim: model width.
        num_heads: number of heads (``dim % num_heads == 0``).
        block_size: ``b``.
        window_blocks: ``w``, odd.
        global_blocks: ``g``.
        random_blocks: ``r``.
        seed: seeds the random blocks when no generator is given.
        dropout: on the weights, training only.
        bias: projections with bias.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = BigBirdAttention(16, 2, block_size=2, window_blocks=3, global_blocks=1, random_blocks=1)
        >>> layer(torch.randn(2, 11, 16), generator=torch.Generator().manual_seed(1)).shape
        torch.Size([2, 11, 16])
    """

    def __init__(self, dim: int, num_heads: int, *, block_size: int = 64, window_blocks: int = 3,
                 global_blocks: int = 2, random_blocks: int = 3, seed: int = 0, dropout: float = 0.0,
                 bias: bool = True):
        super().__init__(dim, num_heads, dropout=dropout, bias=bias)
        who = "BigBirdAttention"
        self.block_size = check_int(who, "block_size", block_size, 1)
        self.window_blocks = check_int(who, "window_blocks", window_blocks, 1)
        if window_blocks % 2 == 0:
            raise ArgumentError(f"{who}: window_blocks must be odd (the block itself and (w-1)/2 on each side); "
                                f"got {window_blocks}")
        self.global_blocks = check_int(who, "global_blocks", global_blocks, 0)
        self.random_blocks = check_int(who, "random_blocks", random_blocks, 0)
        self.seed = check_int(who, "seed", seed, 0)

    def layout(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """The block layout ``(nb, nb)`` for ``n`` positions (True = attend), with this call's random blocks."""
        nb = -(-n // self.block_size)
        g = min(self.global_blocks, nb)
        idx = torch.arange(nb)
        lay = (idx[:, None] - idx[None, :]).abs() <= self.window_blocks // 2
        lay[:, :g] = True
        lay[:g, :] = True
        if self.random_blocks and nb:
            if generator is not None and not isinstance(generator, torch.Generator):
                raise DTypeError("BigBirdAttention: generator must be a torch.Generator; "
                                 f"got {type(generator).__name__}")
            gen = generator if generator is not None else torch.Generator().manual_seed(self.seed)
            keys = torch.rand(nb, nb, generator=gen, device=gen.device).cpu().masked_fill(lay, -1.0)
            top = keys.topk(min(self.random_blocks, nb), dim=1)  # r largest among the unseen blocks
            lay |= torch.zeros_like(lay).scatter(1, top.indices, top.values >= 0)
        return lay

    def forward(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        self.check_input(x)
        n, bs = x.shape[1], self.block_size
        lay = self.layout(n, generator)
        g = min(self.global_blocks, lay.shape[0])
        split = min(g * bs, n)  # rows before split are global
        q, k, v = self.project(x)  # (B, H, n, D) each
        parts = []
        if split:  # global rows see every key: dense attention of those rows only
            parts.append(attention(q[:, :, :split], k, v, dropout_p=self.dropout_p))
        if split < n:  # the other rows on the block-sparse kernel; row block 0 here is block g
            pattern = BlockPattern(lay[g:].to(x.device), bs)
            parts.append(attention(q[:, :, split:], k, v, mask=pattern, dropout_p=self.dropout_p))
        return self.merge_heads(torch.cat(parts, 2) if parts else q)  # no parts: n = 0

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, block_size={self.block_size}, "
                f"window_blocks={self.window_blocks}, global_blocks={self.global_blocks}, "
                f"random_blocks={self.random_blocks}, seed={self.seed}")


def _example():
    g = torch.Generator().manual_seed(0)
    layer = BigBirdAttention(16, 2, block_size=2, window_blocks=3, global_blocks=1, random_blocks=2)
    return layer, (torch.randn(2, 15, 16, generator=g),)


def _count(t, s, module):
    n, bs = s["length"], module.block_size
    projections(t, s)
    lay = module.layout(n)
    g = min(module.global_blocks, lay.shape[0])
    split = min(g * bs, n)
    b, h, hd = s["batch"], s["heads"], s["dim"] // s["heads"]
    if split:
        attend(t, "global rows: ", b, h, split, n, hd, hd, dtype=dtype_of(s), dropout_p=module.dropout_p)
    if split < n:
        attend(t, "other rows: ", b, h, n - split, n, hd, hd, dtype=dtype_of(s), mask=BlockPattern(lay[g:], bs),
               dropout_p=module.dropout_p)


_BLOCKS = ("block_size", "window_blocks", "global_blocks", "random_blocks", "seed")
register(Entry("bigbird", BigBirdAttention, "Zaheer et al. 2020, arXiv:2007.14062, eq. 1, Sec. 2 and App. D",
               "O(L (w + g + r) b D)", "blocked window, global and random attention, reproducible random blocks",
               "long-sequence", _example,
               spec=projected_spec(
                   BigBirdAttention, _count, "global rows 2 B H g b n 2D; other rows over their layout's blocks",
                   options=_BLOCKS, sizes={"length": 15, "block_size": 2, "window_blocks": 3, "global_blocks": 1,
                                           "random_blocks": 2, "seed": 0},
                   at_scale={"block_size": 64, "window_blocks": 3, "global_blocks": 2, "random_blocks": 3},
                   source="Zaheer et al. 2020, arXiv:2007.14062, App. E (BigBird-ITC): blocks of b = 64, window 3 b, "
                          "global 2 b, random 3 b")))
