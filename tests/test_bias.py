"""Score modifiers in attnkit.bias: ALiBi slopes and alignment, T5 buckets, RelativePositionBias gradients.

References are float64 transcriptions: Press et al. 2022 (arXiv:2108.12409) Sec. 3 for the
slopes and the bias ``-m (i - j)``; Raffel et al. 2020 (arXiv:1910.10683) Sec. 2.1 for the
bucketing rule; Shaw et al. 2018 (arXiv:1803.02155) eq. 3-4 for clipping.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch.autograd import gradcheck

import attnkit
from attnkit import masks
from attnkit.bias import ALiBi, RelativePositionBias, alibi, t5_buckets
from attnkit.errors import ArgumentError, BackendError, DTypeError, ShapeError

B, H, LQ, LK, D = 2, 3, 5, 7, 11


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _qkv(lq=LQ, lk=LK, h=H, seed=0):
    return _randn(B, h, lq, D, seed=seed), _randn(B, h, lk, D, seed=seed + 1), _randn(B, h, lk, 4, seed=seed + 2)


def ref_attention(q, k, v, bias_fn, causal_offset=None):
    """softmax(q.k / sqrt(D) + bias_fn(h, i, j)) v with loops; keys j > i + causal_offset excluded."""
    out = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in range(q.shape[2]):
                js = [j for j in range(k.shape[2]) if causal_offset is None or j <= i + causal_offset]
                s = torch.stack([q[b, h, i] @ k[b, h, j] / math.sqrt(q.shape[-1]) + bias_fn(h, i, j) for j in js])
                w = torch.softmax(s, dim=0)
                out[b, h, i] = sum(w[n] * v[b, h, j] for n, j in enumerate(js))
    return out


# ---------------------------------------------------------------- ALiBi slopes

def paper_slopes(n):
    """Press et al. 2022 Sec. 3: geometric sequence starting at 2^(-8/n) with that ratio; for n not a power
    of 2, the slopes of the closest smaller power 2^a, then the in-between slopes of 2^(a+1) heads."""
    a = math.floor(math.log2(n))
    c = 2 ** a
    slopes = [2.0 ** (-8.0 * (i + 1) / c) for i in range(c)]
    return slopes + [2.0 ** (-8.0 * (2 * i + 1) / (2 * c)) for i in range(n - c)]


def test_alibi_slopes_eight_heads_are_powers_of_two():
    assert torch.equal(ALiBi(8).slopes, torch.tensor([2.0 ** -i for i in range(1, 9)]))
    assert torch.equal(ALiBi(2).slopes, torch.tensor([2.0 ** -4, 2.0 ** -8]))
    torch.testing.assert_close(ALiBi(16).slopes, torch.tensor([2.0 ** (-i / 2) for i in range(1, 17)]))


def test_alibi_slopes_non_powers_of_two():
    assert torch.equal(ALiBi(3).slopes, torch.tensor([2.0 ** -4, 2.0 ** -8, 2.0 ** -2]))
    assert torch.equal(ALiBi(6).slopes, torch.tensor([2.0 ** -e for e in (2, 4, 6, 8, 1, 3)]))
    expected12 = [2.0 ** -e for e in range(1, 9)] + [2.0 ** -e for e in (0.5, 1.5, 2.5, 3.5)]
    torch.testing.assert_close(ALiBi(12).slopes, torch.tensor(expected12))
    for n in range(1, 41):
        torch.testing.assert_close(ALiBi(n).slopes, torch.tensor(paper_slopes(n), dtype=torch.float32))


def test_alibi_rejects_bad_arguments():
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match="num_heads"):
            ALiBi(bad)
    with pytest.raises(ValueError, match="align"):
        ALiBi(4, align="center")


# ---------------------------------------------------------------- ALiBi in attention

@pytest.mark.parametrize("backend", ["reference", "chunked", "blocksparse"])
def test_alibi_matches_paper_with_causal_mask(backend):
    q, k, v = _qkv(lq=LK)
    m = paper_slopes(H)
    expect = ref_attention(q, k, v, lambda h, i, j: -m[h] * (i - j), causal_offset=0)
    got = attnkit.attention(q, k, v, mask=masks.causal(), bias=alibi(H), backend=backend)
    torch.testing.assert_close(got, expect, rtol=0, atol=1e-6)  # slopes are stored in float32


@pytest.mark.parametrize("backend", ["reference", "chunked", "blocksparse"])
def test_alibi_decode_bottom_right_equals_last_rows_of_full_pass(backend):
    q, k, v = _qkv(lq=LK)
    full = attnkit.attention(q, k, v, mask=masks.causal(), bias=alibi(H), backend="reference")
    one = attnkit.attention(q[:, :, -1:], k, v, mask=masks.causal(), bias=alibi(H), backend=backend)
    torch.testing.assert_close(one, full[:, :, -1:], rtol=0, atol=1e-12)
    three = attnkit.attention(q[:, :, -3:], k, v, mask=masks.causal(), bias=alibi(H), backend=backend)
    torch.testing.assert_close(three, full[:, :, -3:], rtol=0, atol=1e-12)
    # the alignment matters: a top-left ALiBi puts the decoding query at position 0
    top = attnkit.attention(q[:, :, -1:], k, v, mask=masks.causal(), bias=alibi(H, align="top_left"))
    assert not torch.allclose(top, full[:, :, -1:], atol=1e-3)


# ---------------------------------------------------------------- T5 buckets

def t5_rule(relative, num_buckets, max_distance, bidirectional):
    """Raffel et al. 2020 Sec. 2.1 (as in their released code): exact buckets for small |j - i|,
    logarithmic up to max_distance, the rest in the last bucket; bidirectional halves by sign."""
    n = -relative  # distance of a key behind the query
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        if n < 0:
            bucket += num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    exact = num_buckets // 2
    if n < exact:
        return bucket + n
    log_bucket = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact))
    return bucket + min(log_bucket, num_buckets - 1)


@pytest.mark.parametrize("num_buckets,max_distance,bidirectional",
                         [(32, 128, True), (32, 128, False), (8, 20, True), (16, 32, False), (10, 50, True)])
def test_t5_buckets_follow_the_rule(num_buckets, max_distance, bidirectional):
    rel = torch.arange(-400, 401)
    got = t5_buckets(rel, num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional)
    expect = [t5_rule(r, num_buckets, max_distance, bidirectional) for r in rel.tolist()]
    assert got.tolist() == expect
    assert int(got.min()) >= 0 and int(got.max()) == num_buckets - 1


def test_t5_buckets_known_values_and_shape():
    rel = torch.tensor([[0, -1, 1, -7, -8, -1000], [7, 8, 1000, -15, 15, 2]])
    got = t5_buckets(rel)  # 32 buckets, max distance 128, bidirectional
    assert got.tolist() == [[0, 1, 17, 7, 8, 15], [23, 24, 31, 9, 25, 18]]


def _t5_settings():
    """(num_buckets, max_distance, bidirectional) over the valid range: the smallest bucket counts, odd ones,
    max_distance just past the exact buckets and far beyond them."""
    found = []
    for bidirectional in (True, False):
        for num_buckets in (4, 5, 6, 8, 9, 16, 32, 33, 64) if bidirectional else (2, 3, 4, 7, 8, 16, 32):
            exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
            found += [(num_buckets, m, bidirectional) for m in sorted({exact + 1, exact + 2, 2 * exact + 3, 128, 1000})]
    return found


@pytest.mark.parametrize(("num_buckets", "max_distance", "bidirectional"), _t5_settings())
def test_t5_buckets_equal_transformers_t5(num_buckets, max_distance, bidirectional):
    """Oracle: the bucketing of transformers' T5 (its own code, a different implementation of the rule)."""
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    rel = torch.arange(-1500, 1501)
    want = t5.T5Attention._relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=num_buckets,
                                                    max_distance=max_distance)
    got = t5_buckets(rel, num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional)
    assert torch.equal(got, want)
    rpb = RelativePositionBias(2, num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional)
    assert torch.equal(rpb.bucket(rel), want) and int(want.max()) < rpb.table.shape[1]


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"num_buckets": 32, "max_distance": 8}, ArgumentError, "max_distance must be an int >= 9"),  # read wrong buckets
    ({"num_buckets": 32, "max_distance": 4}, ArgumentError, "beyond the 8 exact buckets"),
    ({"num_buckets": 8, "max_distance": 2}, ArgumentError, "max_distance must be an int >= 3"),  # log(1) = 0
    ({"num_buckets": 16, "max_distance": 0}, ArgumentError, "max_distance"),  # log of a negative ratio
    ({"num_buckets": 16, "max_distance": -5}, ArgumentError, "max_distance"),
    ({"num_buckets": 16, "max_distance": 40.0}, ArgumentError, "max_distance must be an int"),
    ({"num_buckets": 2}, ArgumentError, "num_buckets must be an int >= 4"),  # no exact bucket: 0 division
    ({"num_buckets": 1, "bidirectional": False}, ArgumentError, "num_buckets must be an int >= 2"),
    ({"num_buckets": 0}, ArgumentError, "num_buckets"),
    ({"num_buckets": -3}, ArgumentError, "num_buckets"),
    ({"num_buckets": True}, ArgumentError, "num_buckets"),
    ({"bidirectional": "yes"}, DTypeError, "bidirectional must be a bool"),
    ({"mode": "shaw"}, ArgumentError, "mode must be 't5' or 'clip'"),
    ({"align": "bottom-right"}, ArgumentError, "align must be 'bottom_right' or 'top_left'"),
    ({"mode": "clip", "max_distance": 0}, ArgumentError, "max_distance must be an int >= 1"),
    ({"mode": "clip", "max_distance": -2}, ArgumentError, "max_distance"),
])
def test_relative_position_bias_checks_every_argument(kwargs, error, words):
    with pytest.raises(error, match=re.escape(words)) as info:
        RelativePositionBias(3, **kwargs)
    assert str(info.value).startswith("RelativePositionBias: ")
    if "mode" not in kwargs and "align" not in kwargs:  # the bucketing function checks the same way
        bucket_args = {k: kwargs[k] for k in ("num_buckets", "max_distance", "bidirectional") if k in kwargs}
        with pytest.raises(error, match=re.escape(words)):
            t5_buckets(torch.arange(-3, 4), **bucket_args)


@pytest.mark.parametrize("heads", [0, -1, 2.0, None])
def test_relative_position_bias_checks_num_heads(heads):
    with pytest.raises(ArgumentError, match="RelativePositionBias: num_heads must be an int >= 1"):
        RelativePositionBias(heads)


# ---------------------------------------------------------------- RelativePositionBias

def _rpb(mode="t5", seed=3, **kw):
    rpb = RelativePositionBias(H, mode=mode, num_buckets=8, max_distance=4, **kw).double()
    with torch.no_grad():
        rpb.table.copy_(_randn(*rpb.table.shape, seed=seed))
    return rpb


@pytest.mark.parametrize("mode", ["t5", "clip"])
def test_relative_position_bias_matches_transcription(mode):
    rpb = _rpb(mode)
    q, k, v = _qkv()
    shift = LK - LQ  # bottom-right: query i sits at position i + Lk - Lq
    table = rpb.table.detach()
    if mode == "t5":
        bias_fn = lambda h, i, j: table[h, t5_rule(j - i - shift, 8, 4, True)]
    else:  # Shaw et al.: clip(j - i, -k, k), here k = max_distance = 4
        bias_fn = lambda h, i, j: table[h, max(-4, min(4, j - i - shift)) + 4]
    got = attnkit.attention(q, k, v, bias=rpb, backend="reference")
    torch.testing.assert_close(got, ref_attention(q, k, v, bias_fn), rtol=0, atol=1e-12)


def test_relative_position_bias_zero_init_is_no_bias():
    q, k, v = _qkv()
    rpb = RelativePositionBias(H).double()
    torch.testing.assert_close(attnkit.attention(q, k, v, bias=rpb), attnkit.attention(q, k, v), rtol=0, atol=1e-12)


def _grads(backend, rpb, q, k, v, mask):
    rpb.zero_grad()
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = attnkit.attention(q, k, v, mask=mask, bias=rpb, backend=backend)
    (out * _randn(*out.shape, seed=9)).sum().backward()
    return out.detach(), rpb.table.grad.clone(), q.grad, k.grad, v.grad


def test_relative_position_bias_gradients_agree_across_backends():
    rpb = RelativePositionBias(H, num_buckets=16, max_distance=64).double()
    with torch.no_grad():
        rpb.table.copy_(_randn(H, 16, seed=4))
    q, k, v = _randn(1, H, 130, 8), _randn(1, H, 150, 8, seed=1), _randn(1, H, 150, 5, seed=2)
    mask = masks.sliding_window(40, 0)  # bottom-right window, several 64-blocks: blocksparse gathers
    ref = _grads("reference", rpb, q, k, v, mask)
    assert ref[1].abs().sum() > 0
    for backend in ("chunked", "blocksparse"):
        for name, a, b in zip(("out", "table", "q", "k", "v"), ref, _grads(backend, rpb, q, k, v, mask), strict=True):
            torch.testing.assert_close(b, a, rtol=0, atol=1e-10, msg=f"{backend}: {name}")
    with pytest.raises(BackendError, match="sdpa"):
        attnkit.attention(q, k, v, mask=mask, bias=rpb, backend="sdpa")


@pytest.mark.parametrize("backend", ["reference", "chunked"])
def test_relative_position_bias_gradcheck(backend):
    rpb = _rpb()
    q, k, v = (t[:1, :, :3] for t in _qkv())

    def fn(table):
        del rpb.table
        rpb.table = table  # a plain tensor stands in for the parameter
        return attnkit.attention(q, k, v, bias=rpb, mask=masks.causal(), backend=backend)

    table = _randn(H, 8, seed=5).requires_grad_()
    assert gradcheck(fn, (table,))


def test_relative_position_bias_state_dict_round_trip():
    rpb = _rpb(seed=6)
    assert list(rpb.state_dict()) == ["table"] and rpb.table.shape == (H, 8)
    other = RelativePositionBias(H, num_buckets=8, max_distance=4).double()
    other.load_state_dict(rpb.state_dict())
    q, k, v = _qkv()
    assert torch.equal(attnkit.attention(q, k, v, bias=other), attnkit.attention(q, k, v, bias=rpb))


@pytest.mark.parametrize("backend", ["auto", "reference", "chunked", "blocksparse"])
def test_a_modifier_with_other_head_count_raises_a_clear_error(backend):
    q = torch.randn(1, 4, 5, 8)
    for modifier in (ALiBi(2), RelativePositionBias(3)):
        with pytest.raises(ShapeError, match=r"holds parameters for \d heads; got 4 query heads"):
            attnkit.attention(q, q, q, bias=modifier, backend=backend)
    assert attnkit.attention(q, q, q, bias=ALiBi(4), backend=backend).shape == q.shape
