"""The head split and merge every module shares: ``(B, L, H * D) <-> (B, H, L, D)``.

>>> import torch
>>> x = torch.randn(2, 5, 12)
>>> split_heads(x, 3).shape
torch.Size([2, 3, 5, 4])
>>> torch.equal(merge_heads(split_heads(x, 3)), x)
True
"""

from __future__ import annotations

import torch

__all__ = ["split_heads", "merge_heads"]


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``(B, L, H * D) -> (B, H, L, D)``: the last dimension as ``heads`` equal slices, heads before length."""
    return x.unflatten(-1, (heads, -1)).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(B, H, L, D) -> (B, L, H * D)``: the inverse of :func:`split_heads`."""
    return x.transpose(1, 2).flatten(2)
