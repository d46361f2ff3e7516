"""The Mask protocol (masks/base.py) on every mask: block layouts, bands, materialize.

Layouts are checked against the dense picture block by block (``active`` never misses an
allowed entry, ``full`` never claims a masked one, analytic layouts are exact); band
offsets against the predicate.
"""

from __future__ import annotations

import copy as copy_module

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnkit import masks
from attnkit.errors import ArgumentError
from attnkit.masks.base import KINDS as KINDS_OF_MASKS


# ------------------------------------------------------------------ block layouts and materialize
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


# ------------------------------------------------------------------ mask bands
def test_band_offsets_describe_the_allowed_diagonals():
    assert masks.sliding_window(3, 2).band(5, 9) == (4 - 3, 4 + 2)  # bottom-right: offset Lk - Lq = 4
    assert masks.sliding_window(3, 2, align="top_left").band(5, 9) == (-3, 2)
    assert masks.causal().band(6, 6) == (None, 0)
    assert (masks.sliding_window(4, 4) & masks.causal()).band(7, 7) == (-4, 0)
    assert (masks.causal() & masks.sliding_window(2, 9, align="top_left")).band(4, 6) == (-2, 2)
    assert masks.dilated(2, 1).band(5, 5) == (-2, 2)
    assert masks.dilated(2, 3).band(5, 5) is None  # holes: not a band
    assert (masks.sliding_window(1, 1) | masks.causal()).band(5, 5) is None
    assert (~masks.sliding_window(1, 1)).band(5, 5) is None
    assert masks.full().band(3, 4) == (None, None)


@pytest.mark.parametrize(("lq", "lk"), [(9, 9), (4, 11), (11, 4), (1, 6)])
def test_band_offsets_agree_with_the_predicate(lq, lk):
    """``lo <= j - i <= hi`` holds exactly where the mask allows, for every band mask."""
    for mask in (masks.sliding_window(2, 1), masks.sliding_window(0, 3, align="top_left"),
                 masks.sliding_window(3, 3) & masks.causal()):
        lo, hi = mask.band(lq, lk)
        i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
        assert torch.equal(mask.materialize(lq, lk)[0, 0], (j - i >= lo) & (j - i <= hi))


def _random_layout(shape, density, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) < density


# ------------------------------------------------------------------ analytic layouts
@settings(max_examples=25, deadline=None)
@given(lq=st.integers(1, 70), lk=st.integers(1, 70), bs=st.integers(1, 20), stride=st.integers(1, 12),
       block=st.integers(1, 12), summary=st.integers(1, 12))
def test_analytic_layouts_equal_the_evaluated_ones(lq, lk, bs, stride, block, summary):
    """Strided, fixed and block-layout masks: analytic active/full equal brute-force evaluation."""
    lay = _random_layout((5, 6), 0.5, lq * lk)
    for mask in (masks.strided(stride), masks.fixed(block, min(summary, block)), masks.block_layout(lay, block)):
        fast = mask.block_layout(lq, lk, bs)
        exact = mask.block_layout(lq, lk, bs, exact=True)
        assert torch.equal(fast.active, exact.active), mask
        assert torch.equal(fast.full, exact.full), mask
    both = masks.strided(stride) & masks.causal()  # an AND may over-approximate active, never full
    fast, exact = both.block_layout(lq, lk, bs), both.block_layout(lq, lk, bs, exact=True)
    assert bool((fast.active >= exact.active).all()) and torch.equal(fast.full, exact.full)


# ------------------------------------------------------------------ kinds, band terms, text
KINDS = {
    "full": masks.full(), "causal": masks.causal(), "causal top-left": masks.causal(align="top_left"),
    "window": masks.sliding_window(3, 1), "diagonals": masks.diagonals(-2, 4),
    "window & causal": masks.sliding_window(3, 1) & masks.causal(),
    "mixed alignments": masks.causal() & masks.sliding_window(2, 5, align="top_left"),
    "shifted causal": masks.shifted(masks.causal(), q0=5, k0=2, q_len=20, kv_len=20),
    "padding": masks.padding([4, 9]), "keys": masks.keys(torch.tensor([True, False] * 6)),
    "tensor": masks.TensorMask(torch.ones(1, 1, 9, 12, dtype=torch.bool)),
    "strided": masks.strided(3), "dilated": masks.dilated(2, 2), "fixed": masks.fixed(4),
    "or": masks.sliding_window(1, 1) | masks.causal(), "not": ~masks.causal(),
    "segments": masks.segments(torch.arange(12) // 4),
}
EXPECTED_KIND = {"full": "full", "causal": "causal", "causal top-left": "causal", "window": "band",
                 "diagonals": "band", "window & causal": "band", "mixed alignments": "band",
                 "shifted causal": "band", "padding": "keys", "keys": "tensor", "tensor": "tensor",
                 "strided": "pattern", "dilated": "pattern", "fixed": "pattern", "or": "pattern", "not": "pattern",
                 "segments": "pattern"}


@pytest.mark.parametrize("name", list(KINDS))
def test_each_mask_states_its_kind_and_its_band_terms_are_exact(name):
    mask = KINDS[name]
    assert mask.kind == EXPECTED_KIND[name] and mask.kind in KINDS_OF_MASKS
    for lq, lk in ((9, 12), (12, 12), (12, 9), (1, 12)):
        band = mask.band(lq, lk)
        assert (band is not None) == (mask.band_terms is not None)
        if band is None:
            continue
        lo, hi = (-99 if band[0] is None else band[0]), (99 if band[1] is None else band[1])
        i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
        assert torch.equal(mask.materialize(lq, lk, batch=2)[0, 0], (j - i >= lo) & (j - i <= hi)), (lq, lk)


def test_masks_without_tensors_carry_the_text_that_rebuilds_them():
    for mask in KINDS.values():
        if mask.text is not None:
            assert repr(masks.parse(mask.text)) == mask.text == repr(mask)
    assert masks.padding([3]).text is None and (masks.causal() & masks.padding([3])).text is None


def test_chains_are_flat_and_double_negation_cancels():
    chain = masks.causal()
    for _ in range(3000):  # one And of 3001 parts, not 3000 nested ones: repr and evaluation stay shallow
        chain = chain & masks.sliding_window(4)
    assert len(chain.parts) == 3001 and chain.band(8, 8) == (-4, 0)
    assert torch.equal(chain.materialize(8, 8), (masks.causal() & masks.sliding_window(4)).materialize(8, 8))
    negated = masks.causal()
    for _ in range(5001):
        negated = ~negated
    assert repr(negated) == "~causal(align='bottom_right')"


@pytest.mark.parametrize("make", [lambda: masks.sliding_window(10 ** 20), lambda: masks.diagonals(-10 ** 20, 0),
                                  lambda: masks.strided(2 ** 41), lambda: masks.fixed(10 ** 20)])
def test_spans_past_any_sequence_are_refused_by_name(make):
    with pytest.raises(ArgumentError, match=r"must be (at most 2\*\*40|an int >= )"):
        make()


def test_parsing_deeply_nested_text_is_a_clear_error():
    with pytest.raises(ArgumentError, match="nested too deeply"):
        masks.parse("~" * 5000 + "causal()")
    assert repr(masks.parse("~" * 200 + "causal()")) == "causal(align='bottom_right')"


# ------------------------------------------------------------------ key padding as data
_PICKED = torch.randint(0, 12, (12, 4), generator=_g(5))
PADDING_CASES = {**ANALYTIC, **OTHERS, **KINDS,
                 "causal & padding": masks.causal() & masks.padding([4, 9]),
                 "window & padding & keys": masks.sliding_window(2) & masks.padding([7]) & masks.keys(
                     torch.tensor([True, False] * 6)),
                 "selected & causal": masks.selected_keys(_PICKED) & masks.causal(),
                 "selected & padding": masks.selected_keys(_PICKED) & masks.padding([9]),
                 "shifted padding": masks.shifted(masks.padding([9]) & masks.causal(), q0=2, k0=1, q_len=12, kv_len=12)}


@pytest.mark.parametrize("name", list(PADDING_CASES))
def test_pads_keys_says_what_key_padding_finds_and_survives_a_copy(name):
    """``Mask.pads_keys`` (read by the dispatcher instead of calling the mask) is ``key_padding() is not None``,
    the same after it is kept, and in a copy (whose caches start empty)."""
    mask = PADDING_CASES[name]
    expected = mask.key_padding() is not None
    assert mask.pads_keys is expected and mask.pads_keys is expected  # asked once, then read
    copy = copy_module.deepcopy(mask)
    assert copy.pads_keys is expected and copy.cached_bytes() == 0
