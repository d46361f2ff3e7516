"""attnkit.masks constructors against brute-force loops over their definitions; repr; errors.

Block layouts, bands and materialize (the Mask protocol of masks/base.py) are in functional/test_mask_base.py.
"""

from __future__ import annotations

import pytest
import torch

from attnkit import masks

SHAPES = [(3, 7), (7, 7), (7, 3), (1, 5), (6, 1)]  # Lq < Lk, Lq == Lk, Lq > Lk, single rows/keys
ALIGNS = ["bottom_right", "top_left"]


def brute(pred, lq, lk, b=1, h=1):
    """``pred(b, h, i, j)`` evaluated by plain Python loops into a bool ``(b, h, lq, lk)`` tensor."""
    out = torch.zeros(b, h, lq, lk, dtype=torch.bool)
    for bi in range(b):
        for hi in range(h):
            for i in range(lq):
                for j in range(lk):
                    out[bi, hi, i, j] = bool(pred(bi, hi, i, j))
    return out


def assert_matches(mask, pred, lq, lk, b=1, h=1):
    got = mask.materialize(lq, lk, batch=b, heads=h)
    assert got.dtype == torch.bool
    assert torch.equal(torch.broadcast_to(got, (b, h, lq, lk)), brute(pred, lq, lk, b, h)), repr(mask)


def offset(align, lq, lk):
    return lk - lq if align == "bottom_right" else 0


# ------------------------------------------------------------------ constructors vs definitions
@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize(("lq", "lk"), SHAPES)
def test_causal(align, lq, lk):
    off = offset(align, lq, lk)
    assert_matches(masks.causal(align), lambda b, h, i, j: j <= i + off, lq, lk)


def test_causal_default_is_bottom_right_as_pictured():
    assert masks.causal().materialize(2, 4)[0, 0].int().tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert masks.causal("top_left").materialize(2, 4)[0, 0].int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0]]
    assert not masks.causal().materialize(5, 3)[0, 0, :2].any()  # Lq > Lk: leading rows see no key


@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize(("lq", "lk"), SHAPES)
@pytest.mark.parametrize(("left", "right"), [(0, 0), (2, 0), (1, 3)])
def test_sliding_window(align, lq, lk, left, right):
    off = offset(align, lq, lk)
    pred = lambda b, h, i, j: i + off - left <= j <= i + off + right
    assert_matches(masks.sliding_window(left, right, align=align), pred, lq, lk)


@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize(("lq", "lk"), [(5, 13), (13, 13), (13, 6)])
@pytest.mark.parametrize(("window", "dilation"), [(0, 2), (2, 1), (2, 3)])
def test_dilated(align, lq, lk, window, dilation):
    off = offset(align, lq, lk)
    pred = lambda b, h, i, j: any(j == i + off + t * dilation for t in range(-window, window + 1))
    assert_matches(masks.dilated(window, dilation, align=align), pred, lq, lk)


@pytest.mark.parametrize("stride", [1, 3, 4])
@pytest.mark.parametrize(("lq", "lk"), [(5, 13), (13, 13), (13, 6)])
def test_strided_and_fixed_match_their_docstrings(stride, lq, lk):
    assert_matches(masks.strided(stride), lambda b, h, i, j: abs(i - j) < stride or (i - j) % stride == 0, lq, lk)
    for summary in range(1, stride + 1):
        pred = lambda b, h, i, j, c=summary: i // stride == j // stride or j % stride >= stride - c
        assert_matches(masks.fixed(stride, summary), pred, lq, lk)


@pytest.mark.parametrize("l", [1, 2, 3, 5])
def test_strided_and_fixed_with_causal_are_child_et_al_2019_sec_4_2(l):
    """Sparse Transformer (arXiv:1904.10509) Sec. 4.2, written as the paper's sets A1, A2 with j <= i."""
    def strided_paper(b, h, i, j):
        a1 = max(0, i - l) <= j <= i
        a2 = (i - j) % l == 0 and j <= i
        return a1 or a2
    assert_matches(masks.strided(l) & masks.causal(), strided_paper, 17, 17)
    for c in range(1, l + 1):
        def fixed_paper(b, h, i, j, c=c):
            a1 = j // l == i // l
            a2 = j % l in range(l - c, l)
            return (a1 or a2) and j <= i
        assert_matches(masks.fixed(l, c) & masks.causal(), fixed_paper, 17, 17)


@pytest.mark.parametrize(("lq", "lk"), SHAPES)
def test_global_tokens(lq, lk):
    idx = [0, 2, 6, 40]  # 40 is beyond every length and must be ignored
    assert_matches(masks.global_tokens(idx), lambda b, h, i, j: i in idx or j in idx, lq, lk)
    assert_matches(masks.global_tokens(torch.tensor([1])), lambda b, h, i, j: 1 in (i, j), lq, lk)


@pytest.mark.parametrize(("lq", "lk"), [(5, 7), (9, 4), (12, 12)])
def test_block_layout(lq, lk):
    g = torch.Generator().manual_seed(0)
    lay2 = torch.rand(3, 2, generator=g) < 0.5  # covers at most 9 x 6 positions: the rest is outside
    assert_matches(masks.block_layout(lay2, 3), lambda b, h, i, j: i < 9 and j < 6 and lay2[i // 3, j // 3], lq, lk)
    lay4 = torch.rand(2, 3, 4, 4, generator=g) < 0.5  # per batch and head
    pred = lambda b, h, i, j: bool(lay4[b, h, i // 3, j // 3])
    assert_matches(masks.block_layout(lay4, 3), pred, lq, lk, b=2, h=3)


def test_segments_one_dimensional_and_per_batch():
    ids = torch.tensor([0, 0, 1, 1, 1, 2, 3])
    assert_matches(masks.segments(ids), lambda b, h, i, j: ids[i] == ids[j], 7, 7)
    kv_ids = torch.tensor([0, 1, 1, 2])
    assert_matches(masks.segments(ids, kv_ids), lambda b, h, i, j: ids[i] == kv_ids[j], 7, 4)
    per = torch.tensor([[0, 0, 1, 1, 2], [5, 5, 5, 5, 6]])
    assert_matches(masks.segments(per), lambda b, h, i, j: per[b, i] == per[b, j], 5, 5, b=2)
    assert masks.segments(per).batch_size == 2


def test_padding_and_keys():
    lengths = [7, 3, 0]
    assert_matches(masks.padding(lengths), lambda b, h, i, j: j < lengths[b], 5, 7, b=3)
    keep = torch.tensor([[True, False, True, True, False, True, True], [False] * 6 + [True]])
    assert_matches(masks.keys(keep), lambda b, h, i, j: keep[b, j], 5, 7, b=2)
    assert_matches(masks.keys(keep[0]), lambda b, h, i, j: keep[0, j], 5, 7)


@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize(("lq", "lk"), SHAPES)
def test_prefix_lm(align, lq, lk):
    off = offset(align, lq, lk)
    assert_matches(masks.prefix_lm(2, align=align), lambda b, h, i, j: j < 2 or j <= i + off, lq, lk)


def test_from_function_sees_every_index():
    fn = lambda b, h, i, j: (b + 2 * h + i + 3 * j) % 4 == 0
    assert_matches(masks.from_function(fn), fn, 5, 7, b=2, h=3)


def test_combinations():
    causal, window, glob = masks.causal(), masks.sliding_window(1, 1), masks.global_tokens([4])
    assert_matches(causal & window, lambda b, h, i, j: j <= i + 2 and abs(i + 2 - j) <= 1, 5, 7)
    assert_matches(causal | glob, lambda b, h, i, j: j <= i + 2 or 4 in (i, j), 5, 7)
    assert_matches(~causal, lambda b, h, i, j: j > i + 2, 5, 7)
    assert_matches(~(window | glob) & causal, lambda b, h, i, j: j <= i + 2 and abs(i + 2 - j) > 1 and 4 not in (i, j),
                   5, 7)
    pad = masks.padding([6, 2])
    assert_matches(causal & pad, lambda b, h, i, j: j <= i + 2 and j < [6, 2][b], 5, 7, b=2)
    assert (causal & pad).batch_size == 2


# ------------------------------------------------------------------ repr
def test_repr_is_readable():
    assert repr(masks.causal()) == "causal(align='bottom_right')"
    assert repr(masks.sliding_window(3, 1, align="top_left")) == "sliding_window(left=3, right=1, align='top_left')"
    assert repr(masks.strided(4)) == "strided(4)"
    assert repr(masks.fixed(8, 2)) == "fixed(block=8, summary=2)"
    assert repr(masks.padding([3, 1])) == "padding(lengths=[3, 1])"
    assert repr(masks.global_tokens([0, 5])) == "global_tokens([0, 5])"
    assert repr(~masks.causal() | masks.strided(2)) == "(~causal(align='bottom_right') | strided(2))"
    assert "dilated" in repr(masks.dilated(2, 3)) and "prefix_lm(4" in repr(masks.prefix_lm(4))
    assert "mine" in repr(masks.from_function(lambda b, h, i, j: i >= j, "mine"))


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize(("make", "error"), [
    (lambda: masks.sliding_window(-1), ValueError),
    (lambda: masks.sliding_window(2, -3), ValueError),
    (lambda: masks.sliding_window(2.5), ValueError),
    (lambda: masks.causal("left"), ValueError),
    (lambda: masks.sliding_window(1, 1, align="center"), ValueError),
    (lambda: masks.prefix_lm(2, align="bottom"), ValueError),
    (lambda: masks.dilated(2, 0), ValueError),
    (lambda: masks.strided(0), ValueError),
    (lambda: masks.fixed(0), ValueError),
    (lambda: masks.fixed(4, 5), ValueError),
    (lambda: masks.fixed(4, 0), ValueError),
    (lambda: masks.segments(torch.tensor([0.0, 1.0])), TypeError),
    (lambda: masks.segments(torch.tensor([0, 1]), torch.tensor([True, False])), TypeError),
    (lambda: masks.segments(torch.zeros(2, 3, 4, dtype=torch.long)), ValueError),
    (lambda: masks.segments(torch.zeros(2, 4, dtype=torch.long), torch.zeros(3, 4, dtype=torch.long)), ValueError),
    (lambda: masks.padding([1.5, 2.0]), TypeError),
    (lambda: masks.padding([3, -1]), ValueError),
    (lambda: masks.global_tokens([0.5]), TypeError),
    (lambda: masks.global_tokens([-1]), ValueError),
    (lambda: masks.keys(torch.ones(7)), TypeError),
    (lambda: masks.keys(torch.ones(2, 3, 7, dtype=torch.bool)), ValueError),
    (lambda: masks.block_layout(torch.ones(2, 2), 4), TypeError),
    (lambda: masks.block_layout(torch.ones(2, dtype=torch.bool), 4), ValueError),
    (lambda: masks.block_layout(torch.ones(2, 2, dtype=torch.bool), 0), ValueError),
    (lambda: masks.from_function(3), TypeError),
    (lambda: masks.causal() & torch.ones(3, 3, dtype=torch.bool), TypeError),
    (lambda: masks.padding([1, 2]) & masks.padding([1, 2, 3]), ValueError),
    (lambda: masks.causal().block_layout(5, 7, 0), ValueError),
    (lambda: masks.segments(torch.tensor([0, 0, 1])).materialize(5, 5), ValueError),
    (lambda: masks.from_function(lambda b, h, i, j: i - j).materialize(3, 3), TypeError),
])
def test_bad_arguments_raise(make, error):
    with pytest.raises(error):
        make()


def test_diagonals_is_the_general_band():
    assert torch.equal(masks.diagonals(hi=0).materialize(5, 5), masks.causal().materialize(5, 5))
    assert torch.equal(masks.diagonals(hi=3).materialize(2, 5), masks.causal().materialize(2, 5))
    picture = masks.diagonals(-2, 1).materialize(4, 6)[0, 0]
    i, j = torch.arange(4)[:, None], torch.arange(6)[None, :]
    assert torch.equal(picture, (j - i >= -2) & (j - i <= 1))
    assert masks.diagonals().band(3, 3) == (None, None)
    with pytest.raises(ValueError, match="lo"):
        masks.diagonals(lo=1.5)


def test_an_empty_list_of_global_tokens_is_a_valid_empty_set():
    for idx in ([], (), torch.zeros(0, dtype=torch.long)):
        mask = masks.global_tokens(idx)
        assert not mask.materialize(4, 6).any()
        assert torch.equal((mask | masks.causal()).materialize(4, 6), masks.causal().materialize(4, 6))
    assert masks.padding([]).batch_size == 0


def test_full_allows_with_one_size_one_dim_per_index_dim():
    """``full().allows`` broadcasts as the other masks' answers do: one dim per index dim (it was a 0-d tensor,
    which the kernels that read a block's dims could not index: the softcap loop, the selected-keys decode)."""
    b, h, i, j = (torch.arange(n).view(*([1] * a), n, *([1] * (3 - a))) for a, n in enumerate((2, 3, 4, 5)))
    for mask in (masks.full(), masks.full() & masks.full(), ~~masks.full()):
        got = mask.allows(b, h, i, j, 4, 5)
        assert got.dim() == 4 and bool(torch.broadcast_to(got, (2, 3, 4, 5)).all())
        assert got.dtype == torch.bool
