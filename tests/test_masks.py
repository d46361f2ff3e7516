"""attnkit.masks against brute-force loops over their definitions; block layouts; errors."""

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


# ------------------------------------------------------------------ repr and materialize
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


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


_IDS = torch.randint(0, 6, (127,), generator=_g(1)).sort().values
_IDS_B = torch.randint(0, 9, (2, 127), generator=_g(2)).sort(-1).values
ANALYTIC = {"causal_br": masks.causal(), "causal_tl": masks.causal("top_left"),
            "window": masks.sliding_window(5, 2), "window_tl": masks.sliding_window(0, 0, align="top_left"),
            "window_left": masks.sliding_window(20, 0), "padding": masks.padding([127, 50, 0]),
            "global": masks.global_tokens([0, 17, 112, 200])}
OTHERS = {
    "dilated": masks.dilated(3, 4), "strided": masks.strided(9), "fixed": masks.fixed(16, 3),
    "strided_causal": masks.strided(8) & masks.causal(), "fixed_causal": masks.fixed(10, 2) & masks.causal("top_left"),
    "block_layout": masks.block_layout(torch.rand(8, 9, generator=_g(3)) < 0.4, 16),
    "block_layout_heads": masks.block_layout(torch.rand(3, 10, 10, generator=_g(4)) < 0.4, 13),
    "segments": masks.segments(_IDS), "segments_batch": masks.segments(_IDS_B),
    "prefix_lm": masks.prefix_lm(20), "prefix_lm_tl": masks.prefix_lm(10, align="top_left"),
    "function": masks.from_function(lambda b, h, i, j: (i * j) % 7 == 0, "mod7"),
    "not_causal": ~masks.causal(), "not_window_and_causal": ~masks.sliding_window(4, 4) & masks.causal(),
    "causal_or_global": masks.causal() | masks.global_tokens([3]),
    "window_and_padding": masks.sliding_window(8, 8) & masks.padding([100, 7]),
    "not_fixed_or_segments": ~masks.fixed(12, 1) | masks.segments(_IDS), "full": masks.full(),
}
HEAD_MASKS = [pytest.param(masks.from_function(lambda b, h, i, j: (i + j + h) % 5 == 0, "by_head"), id="function_h")]
ALL_MASKS = [pytest.param(m, id=n) for n, m in {**ANALYTIC, **OTHERS}.items()]
LAYOUT_SIZES = [(113, 127), (127, 113), (64, 64), (1, 127), (127, 1), (5, 7)]


def _sizes(mask):
    """Batch and heads to materialize: the mask's own, 2 and 3 if it reads b/h without one, else 1."""
    b = (mask.batch_size or 2) if "b" in mask.uses else 1
    return b, (mask.num_heads or 3) if "h" in mask.uses else 1


def _truth(dense, bs):
    """Per block of a dense mask: is some in-range entry allowed, are all in-range entries allowed."""
    b, h, lq, lk = dense.shape
    nq, nk = -(-lq // bs), -(-lk // bs)
    some = torch.zeros(b, h, nq * bs, nk * bs, dtype=torch.bool)
    every = torch.ones(b, h, nq * bs, nk * bs, dtype=torch.bool)
    some[..., :lq, :lk], every[..., :lq, :lk] = dense, dense
    shape = (b, h, nq, bs, nk, bs)
    return some.view(shape).any(5).any(3), every.view(shape).all(5).all(3)


def _check_layouts(mask, analytic):
    b, h = _sizes(mask)
    for lq, lk in LAYOUT_SIZES:
        dense = torch.broadcast_to(mask.materialize(lq, lk, batch=b, heads=h), (b, h, lq, lk))
        for bs in (1, 7, 16, 64):
            some, every = _truth(dense, bs)
            exact = mask.block_layout(lq, lk, bs, exact=True, batch=b, heads=h)
            lay = mask.block_layout(lq, lk, bs, batch=b, heads=h)
            where = f"{mask!r} Lq={lq} Lk={lk} bs={bs}"
            assert torch.equal(torch.broadcast_to(exact.active, some.shape), some), where
            assert torch.equal(torch.broadcast_to(exact.full, some.shape), every), where
            active, full = torch.broadcast_to(lay.active, some.shape), torch.broadcast_to(lay.full, some.shape)
            assert not (some & ~active).any(), f"active misses an allowed entry: {where}"
            assert not (full & ~every).any(), f"full claims a block with a masked entry: {where}"
            if analytic:
                assert torch.equal(active, some), f"analytic active is not exact: {where}"


@pytest.mark.parametrize("mask", [pytest.param(m, id=n) for n, m in ANALYTIC.items()])
def test_analytic_layouts_are_exact(mask):
    _check_layouts(mask, analytic=True)


@pytest.mark.parametrize("mask", [pytest.param(m, id=n) for n, m in OTHERS.items()] + HEAD_MASKS)
def test_layouts_are_sound(mask):
    _check_layouts(mask, analytic=False)


class _UnsoundCausal(masks.Mask):
    """Top-left causal with a wrong layout: ``drop_last`` forgets the last key block, else ``full = active``."""

    uses = frozenset({"q", "kv"})

    def __init__(self, drop_last):
        self.drop_last = drop_last

    def allows(self, b, h, q_idx, kv_idx, q_len, kv_len):
        return kv_idx <= q_idx

    def _layout(self, q_len, kv_len, bs, device, sizes=(1, 1)):
        active, full = (t.clone() for t in self._evaluated_layout(q_len, kv_len, bs, device, sizes))
        if self.drop_last:
            active[..., -1] = False
            return active, full
        return active, active


@pytest.mark.parametrize("mask", [masks.keys(torch.rand(2, 127, generator=_g(5)) < 0.5),
                                  masks.TensorMask(torch.rand(2, 1, 113, 127, generator=_g(6)) < 0.02)],
                         ids=["keys", "dense"])
def test_tensor_mask_layouts_are_exact(mask):
    """A tensor mask fixes Lk (and Lq when dense): its pooled layout is exact at every block size."""
    dense = torch.broadcast_to(mask.materialize(113, 127), (2, 1, 113, 127))
    for bs in (1, 7, 16, 64):
        some, every = _truth(dense, bs)
        lay = mask.block_layout(113, 127, bs)
        assert torch.equal(torch.broadcast_to(lay.active, some.shape), some)
        assert torch.equal(torch.broadcast_to(lay.full, some.shape), every)


@pytest.mark.parametrize(("drop_last", "message"), [(True, "active misses"), (False, "full claims")])
def test_layout_checks_catch_an_unsound_layout(drop_last, message):
    with pytest.raises(AssertionError, match=message):
        _check_layouts(_UnsoundCausal(drop_last), analytic=False)


@pytest.mark.parametrize("mask", [*ALL_MASKS, pytest.param(masks.keys(torch.tensor([[True] * 6 + [False]] * 2)),
                                  id="keys")])
def test_materialize_shape(mask):
    b, h = _sizes(mask)
    want = (b if "b" in mask.uses else 1, h if "h" in mask.uses else 1, 5, 7)
    assert tuple(mask.materialize(5, 7, batch=b, heads=h).shape) == want


@pytest.mark.parametrize(("lq", "lk"), [(0, 7), (5, 0)])
def test_layout_shape_with_empty_sequence(lq, lk):
    for mask in (masks.causal(), masks.sliding_window(1, 1), masks.padding([3, 1])):
        lay = mask.block_layout(lq, lk, 4)
        assert lay.active.shape[2:] == lay.full.shape[2:] == (-(-lq // 4), -(-lk // 4)), repr(mask)


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
