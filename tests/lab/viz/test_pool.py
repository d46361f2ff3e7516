"""viz/_pool.py: long maps pooled into groups of consecutive positions; rows keep their sums; labels of groups."""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab.viz._pool import bounds, fit_size, pool, pooled_labels


def pooled_by_hand(w: torch.Tensor, size: int) -> torch.Tensor:
    """Float64 oracle with loops: cut each axis into ``size`` even groups; each cell the mean over its queries of
    the sum over its keys."""
    lq, lk = w.shape
    cut = lambda n: [(round(g * n / size), round((g + 1) * n / size)) for g in range(size)]
    out = torch.zeros(size, size, dtype=torch.float64)
    for i, (q0, q1) in enumerate(cut(lq)):
        for j, (k0, k1) in enumerate(cut(lk)):
            out[i, j] = sum(sum(float(w[q, k]) for k in range(k0, k1)) for q in range(q0, q1)) / (q1 - q0)
    return out


def test_groups_are_even_and_cover_every_position():
    assert bounds(7, 3) == [0, 2, 5, 7] and bounds(4, 10) == [0, 1, 2, 3, 4] and bounds(512, 166)[-1] == 512
    sizes = [b - a for a, b in zip(bounds(242, 100), bounds(242, 100)[1:], strict=False)]
    assert set(sizes) == {2, 3} and sum(sizes) == 242


def test_pooling_equals_the_loops_and_keeps_row_sums():
    g = torch.Generator().manual_seed(0)
    w = torch.softmax(torch.randn(2, 11, 13, generator=g, dtype=torch.float64), -1)
    got, q_edges, k_edges = pool(w, 5)
    assert got.shape == (2, 5, 5) and q_edges == bounds(11, 5) and k_edges == bounds(13, 5)
    for h in range(2):
        torch.testing.assert_close(got[h], pooled_by_hand(w[h], 5), rtol=0, atol=1e-12)
    torch.testing.assert_close(got.sum(-1), torch.ones(2, 5, dtype=torch.float64), rtol=0, atol=1e-12)
    diagonal = pool(torch.eye(12)[None], 4)[0][0]
    torch.testing.assert_close(diagonal, torch.eye(4))  # a concentrated pattern keeps its brightness
    same, *_ = pool(w, None)
    assert same is w and pool(w, 20)[0] is w  # nothing to pool


def test_non_finite_weights_stay_in_their_own_cell():
    w = torch.ones(1, 6, 6)
    w[0, 0, 0] = float("nan")
    w[0, 5, 5] = float("inf")
    got = pool(w, 3)[0][0]
    assert torch.isnan(got[0, 0]) and torch.isinf(got[2, 2])
    assert torch.isfinite(got[torch.tensor([[False, True, True], [True, True, True], [True, True, False]])]).all()


def test_group_labels():
    assert pooled_labels(list("abcdefg"), bounds(7, 3)) == ["a…b", "c…e", "f…g"]
    assert pooled_labels(list("abc"), bounds(3, 5)) == ["a", "b", "c"] and pooled_labels(None, [0, 1]) is None


def test_the_size_that_fits_a_budget():
    shapes = [(12, 242, 242)] * 6  # MiniLM at 242 tokens: 4,216,608 weights
    size = fit_size(shapes, 4_000_000, "x")
    assert 72 * size**2 <= 4_000_000 < 72 * (size + 1) ** 2
    assert fit_size(shapes, 5_000_000, "x") is None  # fits as it is
    assert fit_size([(12, 512, 512)] * 12, 4_000_000, "x") == 166
    assert fit_size([(2, 1, 300)], 100, "x") == 50  # a strip: only the long axis shrinks
    with pytest.raises(ArgumentError, match="x: 144 heads need at least one weight each"):
        fit_size([(12, 512, 512)] * 12, 100, "x")
    with pytest.raises(ArgumentError, match="max_weights must be an int >= 1"):
        fit_size(shapes, 0, "x")
