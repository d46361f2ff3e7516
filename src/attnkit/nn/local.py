"""Local attention: a window of keys around each query (Luong local-m), or non-overlapping blocks."""

from __future__ import annotations

import torch

from .. import masks
from ..core import attention
from ..costing.attend import ATTENTION_FORMULA, projections
from ..errors import ArgumentError, check_int
from ..registry.entry import Entry, register
from ._projections import ProjectedAttention, count_self_attention, projected_spec

__all__ = ["LocalAttention"]

_MODES = ("window", "blocks")


class LocalAttention(ProjectedAttention):
    """Multi-head self-attention over a local window of keys, or within fixed non-overlapping blocks.

    Luong, Pham & Manning 2015, arXiv:1508.04025, Sec. 3.2 ("local attention", local-m):
    each target position ``t`` attends to the source window ``[p_t - D, p_t + D]`` with the
    monotonic alignment ``p_t = t``; with eq. 7's softmax over the window and scaled dot scores
    ``out_t = sum_{|s - t| <= D} softmax_s(q_t . k_s / sqrt(d)) v_s``. ``mode="blocks"``
    instead splits the sequence into non-overlapping blocks of ``D`` positions that attend
    only within themselves (block-local attention)::

        window, D=1          blocks, D=2          causal window, D=1
        x x . . .            x x . . .            x . . . .
        x x x . .            x x . . .            x x . . .
        . x x x .            . . x x .            . x x . .
        . . x x x            . . x x .            . . x x .
        . . . x x            . . . . x            . . . x x

    Notation: ``D`` = ``size``; ``t``/``s`` = query/key positions; ``d`` = head width.

    Differences from the paper: self-attention over one sequence with multi-head projections
    and scaled dot scores (Luong attends a decoder state over encoder states with the "general"
    or "dot" score); only local-m: local-p's predicted centre ``p_t`` and its Gaussian factor
    are not implemented. ``causal=True`` keeps keys ``s <= t`` (``[t - D, t]``, or the block's
    prefix). Causal alignment is top-left: queries and keys are the same positions.

    Shapes:
        ``x`` ``(B, n, dim)`` -> ``(B, n, dim)``; any ``n`` (the last block may be shorter).

    Complexity:
        ``O(B H n w d)`` time and ``O(B H n w)`` memory with ``w = 2D + 1`` keys per query
        (``D + 1`` causal; ``D`` for blocks), plus ``O(B n dim^2)`` for the projections.

    Args:
        dim: model width.
        num_heads: number of heads (``dim % num_heads == 0``).
        size: window half-width ``D`` (mode "window") or block length (mode "blocks").
        mode: "window" or "blocks".
        causal: only keys at or before the query.
        dropout: on the weights, training only.
        bias: projections with bias.

    Example:
        >>> import torch
        >>> _ = torch.manual_seed(0)
        >>> layer = LocalAttention(16, 2, 3, causal=True)
        >>> layer(torch.randn(2, 10, 16)).shape
        torch.Size([2, 10, 16])
    """

    def __init__(self, dim: int, num_heads: int, size: int, *, mode: str = "window", causal: bool = False,
                 dropout: float = 0.0, bias: bool = True):
        super().__init__(dim, num_heads, dropout=dropout, bias=bias)
        if mode not in _MODES:
            raise ArgumentError(f"LocalAttention: mode must be one of {_MODES}; got {mode!r}")
        self.size = check_int("LocalAttention", "size", size, 1 if mode == "blocks" else 0)
        self.mode, self.causal = mode, bool(causal)
        # A window does not depend on n: build it once so its block layouts are cached.
        self._window = masks.sliding_window(size, 0 if causal else size) if mode == "window" else None

    def pattern(self, n: int, device=None):
        """The attnkit mask of the keys each query sees, for a sequence of ``n`` positions."""
        if self._window is not None:
            return self._window
        blocks = masks.segments(torch.arange(n, device=device) // self.size)
        return blocks & masks.causal() if self.causal else blocks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.check_input(x)
        q, k, v = self.project(x)  # (B, H, n, D) each
        out = attention(q, k, v, mask=self.pattern(x.shape[1], x.device), dropout_p=self.dropout_p)
        return self.merge_heads(out)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, num_heads={self.num_heads}, size={self.size}, mode={self.mode!r}, causal={self.causal}"


def _example():
    g = torch.Generator().manual_seed(0)
    return LocalAttention(16, 2, 3), (torch.randn(2, 12, 16, generator=g),)


def _count(t, s, module):
    projections(t, s)
    count_self_attention(t, "", s, module, module.pattern(s["length"]))


register(Entry("local", LocalAttention, "Luong et al. 2015, arXiv:1508.04025, Sec. 3.2 (local-m)",
               "O(L w D)", "each query attends a window of 2D+1 keys, or its own block",
               "long-sequence", _example,
               spec=projected_spec(LocalAttention, _count, ATTENTION_FORMULA, options=("size", "mode", "causal"),
                                   sizes={"size": 3, "mode": "window", "causal": False})))
