"""Mask and bias texts of benchmark cases (attnkit.lab.analysis.patterns): the suite's extra patterns
and dense biases."""

from __future__ import annotations

import pytest
import torch

from attnkit.lab.analysis.patterns import active_pairs, dense_bias, make_mask


def test_active_pairs_counts_allowed_entries():
    for text in ("sliding_window(3, 2)", "documents(3)", "causal() & strided(4)"):
        dense = make_mask(text, 23).materialize(23, 23)
        assert active_pairs(make_mask(text, 23), 2, 3, 23, 23) == int(dense.sum()) * 6
    assert active_pairs(None, 2, 3, 5, 7) == 210


def test_extra_patterns():
    docs = make_mask("documents(3)", 9).materialize(9, 9)[0, 0]
    assert docs.equal(torch.block_diag(*[torch.ones(3, 3, dtype=torch.bool)] * 3))
    big = make_mask("bigbird(4, 3, 1, 0)", 16).materialize(16, 16)[0, 0]
    assert big[:4].all() and big[:, :4].all()  # one global block row and column
    assert big[8:12, 4:16].equal(torch.ones(4, 12, dtype=torch.bool))  # band of 3 blocks around block 2
    assert not big[12:, 4:8].any()
    lf = make_mask("longformer(1, 2)", 6).materialize(6, 6)[0, 0]
    assert lf[:, :2].all() and lf[:2].all() and lf[3, 4] and not lf[5, 2]


def test_dense_alibi_bias_is_minus_slope_times_distance():
    bias = dense_bias("alibi", 2, 3, 4)
    slopes = [2 ** -4, 2 ** -8]  # 2^(-8/H * (h+1)) for H = 2
    for h in range(2):
        for i in range(3):
            for j in range(4):
                assert bias[0, h, i, j].item() == pytest.approx(-slopes[h] * abs(i + 1 - j))  # bottom-right
    assert dense_bias("softcap", 2, 3, 4) is None
