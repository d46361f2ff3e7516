"""Property tests of every kernel (DESIGN.md section 5), and proof that each property can fail.

The checks are plain functions ``check_xxx(attn_fn, ...)`` taking a kernel with the signature of
:func:`attnkit.attention`; they raise AssertionError when the property is violated. Hypothesis runs
them on every backend in tests.helpers.BACKENDS that accepts the case; the tests at the bottom run
them on the deliberately broken kernels of tests/contract/broken_kernels.py and require each to be caught.
"""

from __future__ import annotations

import contextlib
import functools
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnkit
from attnkit import masks
from attnkit.errors import BackendError
from attnkit.kernels import block_plan, blocksparse_gathered, online_softmax
from tests.contract import broken_kernels as bk
from tests.helpers import BACKENDS, rand_qkv

TOL = {"rtol": 1e-9, "atol": 1e-10}  # inputs are float64: only summation order may differ


def _out(res):
    return res[0] if isinstance(res, tuple) else res


def _allowed(mask, q, k):
    """The mask as a dense bool ``(B, H, Lq, Lk)`` (all True without a mask)."""
    b, h, lq, lk = *q.shape[:3], k.shape[2]
    if mask is None:
        return torch.ones(b, h, lq, lk, dtype=torch.bool)
    return torch.broadcast_to(mask.materialize(lq, lk, batch=b, heads=h), (b, h, lq, lk))


# ------------------------------------------------------------------ the property checks
def check_weights_sum_to_one(attn_fn, q, k, v, mask=None):
    """Each row's weights over its allowed keys sum to 1 (0 for a row with no allowed key)."""
    weights = attn_fn(q, k, v, mask=mask, return_weights=True)[1]
    allowed = _allowed(mask, q, k)
    sums = (weights * allowed).sum(-1)
    torch.testing.assert_close(sums, allowed.any(-1).to(sums.dtype), **TOL)


def check_masked_weights_zero(attn_fn, q, k, v, mask=None):
    """Every masked (query, key) pair gets exactly 0 weight."""
    weights = attn_fn(q, k, v, mask=mask, return_weights=True)[1]
    masked = weights[~_allowed(mask, q, k)]
    assert torch.equal(masked, torch.zeros_like(masked)), f"masked keys got weight up to {masked.abs().max()}"


def check_masked_keys_ignored(attn_fn, q, k, v, mask, j):
    """Rewriting key/value ``j`` with large values leaves every row that may not see ``j`` bit-identical."""
    k2, v2 = k.clone(), v.clone()
    k2[:, :, j], v2[:, :, j] = 1e3 * torch.randn_like(k[:, :, j]), -1e3
    blind = ~_allowed(mask, q, k)[..., j]  # (B, H, Lq): rows that may not see key j
    before, after = _out(attn_fn(q, k, v, mask=mask)), _out(attn_fn(q, k2, v2, mask=mask))
    moved = (before - after)[blind].abs().max() if blind.any() else 0
    assert torch.equal(before[blind], after[blind]), f"a masked key moved outputs by {moved}"


def check_causality(attn_fn, q, k, v, t, mask=None):
    """Under causal() (& mask), changing keys/values at positions >= t leaves past rows unchanged."""
    mask = masks.causal() if mask is None else masks.causal() & mask
    past = torch.arange(q.shape[2]) + k.shape[2] - q.shape[2] < t  # bottom-right: row i's last key is i + Lk - Lq
    k2, v2 = k.clone(), v.clone()
    k2[:, :, t:], v2[:, :, t:] = torch.randn_like(k2[:, :, t:]), torch.randn_like(v2[:, :, t:]) + 5
    before, after = _out(attn_fn(q, k, v, mask=mask)), _out(attn_fn(q, k2, v2, mask=mask))
    torch.testing.assert_close(after[:, :, past], before[:, :, past], **TOL)


def check_chunk_size_invariance(run_at, sizes, q, k, v, mask=None):
    """``run_at(size, q, k, v, mask)`` (a kernel at one chunk/block size) gives one answer for every size."""
    first = run_at(sizes[0], q, k, v, mask)
    for size in sizes[1:]:
        torch.testing.assert_close(run_at(size, q, k, v, mask), first, **TOL, msg=lambda m, s=size: f"size {s}: {m}")


def check_batch_slicing(attn_fn, q, k, v, mask_for):
    """Each sample alone equals its slice of the batched call; ``mask_for(slice)`` gives the mask for a slice."""
    whole = _out(attn_fn(q, k, v, mask=mask_for(slice(None))))
    for i in range(q.shape[0]):
        s = slice(i, i + 1)
        alone = _out(attn_fn(q[s], k[s], v[s], mask=mask_for(s)))
        torch.testing.assert_close(alone, whole[s], **TOL)


def check_permutation_equivariance(attn_fn, q, k, v, perm_q, perm_k, mask=None):
    """Without positions: permuting keys+values together changes nothing; permuting queries permutes outputs."""
    out = _out(attn_fn(q, k, v, mask=mask))
    torch.testing.assert_close(_out(attn_fn(q, k[:, :, perm_k], v[:, :, perm_k], mask=mask)), out, **TOL)
    torch.testing.assert_close(_out(attn_fn(q[:, :, perm_q], k, v, mask=mask)), out[:, :, perm_q], **TOL)


def check_decode_matches_full(attn_fn, q, k, v):
    """KV-cache decode: query i alone against its cache ``k[:i + Lk - Lq + 1]`` equals row i of the full pass."""
    lq, lk = q.shape[2], k.shape[2]
    full = _out(attn_fn(q, k, v, mask=masks.causal("bottom_right")))
    for i in range(max(0, lq - lk), lq):
        n = i + lk - lq + 1  # keys in the cache when query i is decoded
        step = _out(attn_fn(q[:, :, i:i + 1], k[:, :, :n], v[:, :, :n], mask=masks.causal("bottom_right")))
        torch.testing.assert_close(step[:, :, 0], full[:, :, i], **TOL)
    last = _out(attn_fn(q[:, :, -1:], k, v, mask=masks.causal("bottom_right")))
    torch.testing.assert_close(last[:, :, 0], full[:, :, -1], **TOL)


# ------------------------------------------------------------------ real kernels
def _kernel(name):
    return functools.partial(attnkit.attention, backend=name)


def _accepting(q, k, v, **kwargs):
    """The backends that accept this call (the others refuse with BackendError)."""
    names = []
    for name in BACKENDS:
        with contextlib.suppress(BackendError):
            attnkit.explain(q, k, v, backend=name, **kwargs)
            names.append(name)
    assert "reference" in names
    return names


def chunked_at(q, k, v, *, mask=None, block=online_softmax.KV_BLOCK, return_weights=False):
    """The chunked kernel with ``block`` keys per step; below the default block, also the smallest row slab (16)."""
    budget = online_softmax.BUDGET if block >= online_softmax.KV_BLOCK else 1
    with mock.patch.multiple(online_softmax, KV_BLOCK=block, BUDGET=budget):
        return attnkit.attention(q, k, v, mask=mask, return_weights=return_weights, backend="chunked")


def blocksparse_at(q, k, v, *, mask=None, block=64, return_weights=False):
    """The block-sparse kernel with one block size and one query block per slab."""
    with mock.patch.object(block_plan, "BLOCK_SIZES", (block,)), mock.patch.object(blocksparse_gathered, "BUDGET", 1):
        return attnkit.attention(q, k, v, mask=mask, return_weights=return_weights, backend="blocksparse")


# ------------------------------------------------------------------ hypothesis strategies
# masks.full() and masks.keys() have their own tests below.
MASK_KINDS = ("none", "everything", "causal", "window", "padding", "segments", "global", "strided", "fixed",
              "function")


@st.composite
def _mask_for(draw, kind, b, lq, lk):
    """A function ``slice -> mask`` (per-sample data is sliced with the batch)."""
    align = draw(st.sampled_from(["bottom_right", "top_left"]))
    n = max(lq, lk)
    if kind == "padding":
        lengths = torch.tensor(draw(st.lists(st.integers(0, lk), min_size=b, max_size=b)))
        return lambda s: masks.padding(lengths[s])
    if kind == "segments":
        ids = torch.tensor(draw(st.lists(st.lists(st.integers(0, 2), min_size=n, max_size=n), min_size=b,
                                         max_size=b))).sort(-1).values
        return lambda s: masks.segments(ids[s, :lq], ids[s, :lk])
    if kind == "keys":
        keep = torch.tensor(draw(st.lists(st.lists(st.booleans(), min_size=lk, max_size=lk), min_size=b,
                                          max_size=b)))
        return lambda s: masks.keys(keep[s])
    mask = {
        "none": lambda: None,
        "everything": lambda: masks.sliding_window(2 * n, 2 * n),  # allows every pair, usable by blocksparse
        "causal": lambda: masks.causal(align),
        "window": lambda: masks.sliding_window(draw(st.integers(0, 3)), draw(st.integers(0, 2)), align=align),
        "global": lambda: masks.global_tokens([draw(st.integers(0, n))]) | masks.sliding_window(1, 1),
        "strided": lambda: masks.strided(draw(st.integers(1, 4))) & masks.causal(align),
        "fixed": lambda: masks.fixed(3, draw(st.integers(1, 3))) & masks.causal(align),
        "function": lambda: masks.from_function(lambda b, h, i, j: (i + 2 * j) % 3 != 0, "mod3"),
    }[kind]()
    return lambda s: mask


@st.composite
def cases(draw, kinds=MASK_KINDS, max_len=9, min_batch=1):
    """``(q, k, v, mask_for)``: float64 inputs of small random sizes and a mask kind from ``kinds``."""
    b, h = draw(st.integers(min_batch, 3)), draw(st.integers(1, 3))
    lq, lk = draw(st.integers(1, max_len)), draw(st.integers(1, max_len))
    q, k, v = rand_qkv(b, h, lq, lk, draw(st.integers(1, 6)), dv=draw(st.integers(1, 5)), dtype=torch.float64,
                       seed=draw(st.integers(0, 2**16)))
    return q, k, v, draw(_mask_for(draw(st.sampled_from(kinds)), b, lq, lk))


# ------------------------------------------------------------------ properties on every backend
@settings(max_examples=25, deadline=None)
@given(cases())
def test_weights_sum_to_one_and_masked_weights_zero(case):
    q, k, v, mask_for = case
    for name in _accepting(q, k, v, mask=mask_for(slice(None)), return_weights=True):
        check_weights_sum_to_one(_kernel(name), q, k, v, mask_for(slice(None)))
        check_masked_weights_zero(_kernel(name), q, k, v, mask_for(slice(None)))


@settings(max_examples=25, deadline=None)
@given(cases(), st.data())
def test_masked_keys_are_ignored(case, data):
    q, k, v, mask_for = case
    j = data.draw(st.integers(0, k.shape[2] - 1))
    for name in _accepting(q, k, v, mask=mask_for(slice(None))):
        check_masked_keys_ignored(_kernel(name), q, k, v, mask_for(slice(None)), j)


@settings(max_examples=25, deadline=None)
@given(cases(max_len=40), st.sampled_from([1, 3, 7]))
def test_chunked_is_chunk_size_invariant(case, block):
    q, k, v, mask_for = case
    run_at = lambda s, q, k, v, m: chunked_at(q, k, v, mask=m, block=s)
    check_chunk_size_invariance(run_at, (1024, block), q, k, v, mask_for(slice(None)))


@settings(max_examples=25, deadline=None)
@given(cases(kinds=MASK_KINDS[1:], max_len=40), st.sampled_from([1, 2, 3, 5]))
def test_blocksparse_is_block_size_invariant(case, block):
    q, k, v, mask_for = case
    run_at = lambda s, q, k, v, m: blocksparse_at(q, k, v, mask=m, block=s)
    check_chunk_size_invariance(run_at, (128, block), q, k, v, mask_for(slice(None)))


@settings(max_examples=25, deadline=None)
@given(cases(kinds=("none", "window", "padding", "segments", "strided", "function")), st.data())
def test_causality(case, data):
    q, k, v, mask_for = case
    t = data.draw(st.integers(0, k.shape[2] - 1))
    mask = mask_for(slice(None))
    for name in _accepting(q, k, v, mask=masks.causal() if mask is None else masks.causal() & mask):
        check_causality(_kernel(name), q, k, v, t, mask)


@settings(max_examples=25, deadline=None)
@given(cases(min_batch=2))
def test_batch_slicing_invariance(case):
    q, k, v, mask_for = case
    for name in _accepting(q, k, v, mask=mask_for(slice(None))):
        check_batch_slicing(_kernel(name), q, k, v, mask_for)


@settings(max_examples=25, deadline=None)
@given(cases(kinds=("none", "everything")), st.data())
def test_permutation_equivariance(case, data):
    q, k, v, mask_for = case
    perm_q = list(data.draw(st.permutations(range(q.shape[2]))))
    perm_k = list(data.draw(st.permutations(range(k.shape[2]))))
    for name in _accepting(q, k, v, mask=mask_for(slice(None))):
        check_permutation_equivariance(_kernel(name), q, k, v, perm_q, perm_k, mask_for(slice(None)))


@settings(max_examples=25, deadline=None)
@given(cases(kinds=("none",), max_len=6))
def test_kv_decode_matches_full_pass(case):
    q, k, v, _ = case
    for name in _accepting(q, k, v, mask=masks.causal()):
        check_decode_matches_full(_kernel(name), q, k, v)


# ------------------------------------------------------------------ every check catches a broken kernel
def _fixed_inputs():
    return rand_qkv(2, 3, 5, 7, 11, dv=4, dtype=torch.float64, seed=1)  # distinct b, h, Lq, Lk, D, Dv


def _run(prop, fn):
    """Run one check on fixed inputs with kernel ``fn``."""
    q, k, v = _fixed_inputs()
    if prop == "weights_sum_to_one":
        check_weights_sum_to_one(fn, q, k, v, masks.causal())
    elif prop == "masked_weights_zero":
        check_masked_weights_zero(fn, q, k, v, masks.sliding_window(1, 1))
    elif prop == "masked_keys_ignored":
        check_masked_keys_ignored(fn, q, k, v, masks.causal(), 3)
    elif prop == "causality":
        check_causality(fn, q, k, v, 4)
    elif prop == "chunk_size_invariance":
        check_chunk_size_invariance(lambda s, q, k, v, m: fn(q, k, v, mask=m, block=s), (7, 2, 3), q, k, v,
                                    masks.causal())
    elif prop == "batch_slicing":
        lengths = torch.tensor([7, 3])
        check_batch_slicing(fn, q, k, v, lambda s: masks.padding(lengths[s]))
    elif prop == "permutation_equivariance":
        check_permutation_equivariance(fn, q, k, v, [4, 0, 3, 1, 2], [6, 0, 1, 2, 3, 4, 5])
    else:
        check_decode_matches_full(fn, q, k, v)


CATCHES = {
    "weights_sum_to_one": ("wrong_axis", "forgets_mask", "weak_sentinel"),
    "masked_weights_zero": ("forgets_mask", "weak_sentinel", "leaks_future"),
    "masked_keys_ignored": ("forgets_mask", "weak_sentinel", "leaks_future"),
    "causality": ("leaks_future", "forgets_mask"),
    "chunk_size_invariance": ("drops_last_block",),
    "batch_slicing": ("first_sample_mask",),
    "permutation_equivariance": ("drops_last_block",),
    "kv_decode": ("ignores_alignment", "leaks_future"),
}


@pytest.mark.parametrize(("prop", "broken"), [(p, b) for p, names in CATCHES.items() for b in names])
def test_check_catches_broken_kernel(prop, broken):
    with pytest.raises(AssertionError):
        _run(prop, bk.BROKEN[broken])


@pytest.mark.parametrize("prop", list(CATCHES))
@pytest.mark.parametrize("control", ["dense", "reference"])
def test_check_accepts_correct_kernel(prop, control):
    """The same checks on the same inputs pass for a correct kernel, so the failures above are the bugs."""
    if prop == "chunk_size_invariance":
        fn = chunked_at if control == "dense" else blocksparse_at
    else:
        fn = bk.dense if control == "dense" else _kernel("reference")
    _run(prop, fn)


# ------------------------------------------------------------------ cases once broken in the core, kept as tests
@pytest.mark.parametrize("name", BACKENDS)
def test_properties_hold_for_keys_and_tensor_masks(name):
    q, k, v = _fixed_inputs()
    keep = torch.tensor([[True, False, True, True, True, False, True], [False] * 3 + [True] * 4])
    check_masked_keys_ignored(_kernel(name), q, k, v, masks.keys(keep), 1)
    dense_mask = torch.rand(5, 7, generator=torch.Generator().manual_seed(0)) < 0.6
    out = attnkit.attention(q, k, v, mask=dense_mask, backend=name)
    torch.testing.assert_close(out, bk.dense(q, k, v, mask=masks.from_function(lambda b, h, i, j: dense_mask[i, j])))


@pytest.mark.parametrize("name", BACKENDS)
def test_full_mask_equals_no_mask(name):
    q, k, v = _fixed_inputs()
    torch.testing.assert_close(attnkit.attention(q, k, v, mask=masks.full(), backend=name),
                               attnkit.attention(q, k, v, backend="reference"), **TOL)


def test_blocksparse_block_size_invariant_for_head_dependent_function_mask():
    q, k, v = _fixed_inputs()
    mask = masks.from_function(lambda b, h, i, j: (i + 2 * j + h) % 3 != 0, "mod3_by_head")
    check_chunk_size_invariance(lambda s, q, k, v, m: blocksparse_at(q, k, v, mask=m, block=s), (64, 1), q, k, v, mask)
