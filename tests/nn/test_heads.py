"""nn/_heads.py: the head split and merge every module shares."""

from __future__ import annotations

import torch

from attnkit.nn._heads import merge_heads, split_heads


def test_split_puts_each_heads_slice_of_the_width_before_the_length():
    x = torch.arange(2 * 5 * 6, dtype=torch.float64).reshape(2, 5, 6)
    parts = split_heads(x, 3)
    assert parts.shape == (2, 3, 5, 2)
    for h in range(3):  # head h holds columns [2h, 2h + 2) of every position
        assert torch.equal(parts[:, h], x[:, :, 2 * h:2 * h + 2])


def test_merge_undoes_split():
    x = torch.randn(3, 7, 12)
    assert torch.equal(merge_heads(split_heads(x, 4)), x)
