"""The tests' default oracle (tests/oracle.py) against torch's SDPA and the library's reference kernel.

The oracle is written without the library's kernels, so the kernel tests compare with an
answer that shares no code with them; here it is held to torch's own attention in float64,
and to the reference kernel on what SDPA cannot express (mask objects, modifiers, scores,
normalisers, lse, padding).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import attnkit
from attnkit import masks
from attnkit.bias import ALiBi, RelativePositionBias, Softcap
from tests.helpers import oracle, rand_qkv
from tests.oracle import dense_attention

TIGHT = {"rtol": 1e-12, "atol": 1e-12}


def _reference(q, k, v, **kwargs):
    return attnkit.attention(q, k, v, backend="reference", **kwargs)


# ------------------------------------------------------------------ against torch's SDPA, float64
@pytest.mark.parametrize(("lq", "lk", "dv"), [(5, 7, 11), (7, 7, 4), (9, 3, 13), (1, 6, 11)])
def test_no_mask_equals_sdpa(lq, lk, dv):
    q, k, v = rand_qkv(2, 3, lq, lk, 11, dv, dtype=torch.float64, seed=lq + lk)
    torch.testing.assert_close(oracle(q, k, v), F.scaled_dot_product_attention(q, k, v), **TIGHT)


def test_scale_and_dot_score_equal_sdpa_with_that_scale():
    q, k, v = rand_qkv(2, 3, 5, 7, 11, dtype=torch.float64, seed=1)
    torch.testing.assert_close(oracle(q, k, v, scale=0.3), F.scaled_dot_product_attention(q, k, v, scale=0.3), **TIGHT)
    torch.testing.assert_close(oracle(q, k, v, score="dot"), F.scaled_dot_product_attention(q, k, v, scale=1.0),
                               **TIGHT)


def test_causal_equals_sdpa_is_causal():
    q, k, v = rand_qkv(2, 3, 8, 8, 11, dtype=torch.float64, seed=2)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(oracle(q, k, v, mask=masks.causal()), expected, **TIGHT)
    torch.testing.assert_close(oracle(q, k, v, mask=masks.causal(align="top_left")), expected, **TIGHT)


def test_top_left_causal_with_fewer_queries_equals_sdpa_is_causal():
    """SDPA's is_causal is top-left aligned."""
    q, k, v = rand_qkv(2, 3, 4, 9, 11, dtype=torch.float64, seed=3)
    torch.testing.assert_close(oracle(q, k, v, mask=masks.causal(align="top_left")),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True), **TIGHT)


def _bool_mask(shape, seed):
    """A random bool mask whose every row keeps key 0, so SDPA (NaN on empty rows) is defined."""
    m = torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < 0.5
    m[..., 0] = True
    return m


@pytest.mark.parametrize("shape", [(5, 7), (3, 5, 7), (2, 3, 5, 7), (2, 1, 5, 7), (1, 3, 1, 7), (1, 7)],
                         ids=lambda s: "x".join(map(str, s)))
def test_bool_tensor_masks_equal_sdpa(shape):
    q, k, v = rand_qkv(2, 3, 5, 7, 11, dtype=torch.float64, seed=4)
    mask = _bool_mask(shape, seed=len(shape))
    torch.testing.assert_close(oracle(q, k, v, mask=mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                               **TIGHT)


@pytest.mark.parametrize("shape", [(5, 7), (3, 5, 7), (2, 1, 1, 7)], ids=lambda s: "x".join(map(str, s)))
def test_float_bias_equals_sdpa_float_attn_mask(shape):
    q, k, v = rand_qkv(2, 3, 5, 7, 11, dtype=torch.float64, seed=5)
    bias = torch.randn(shape, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    torch.testing.assert_close(oracle(q, k, v, bias=bias), F.scaled_dot_product_attention(q, k, v, attn_mask=bias),
                               **TIGHT)


@pytest.mark.parametrize("mask", [None, "causal"])
def test_grouped_query_heads_equal_sdpa_enable_gqa(mask):
    q, k, v = rand_qkv(2, 6, 9, 9, 11, 5, hkv=2, dtype=torch.float64, seed=7)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=mask == "causal", enable_gqa=True)
    got = oracle(q, k, v, mask=masks.causal() if mask else None)
    torch.testing.assert_close(got, expected, **TIGHT)


def test_rank_2_and_3_inputs_equal_sdpa():
    q, k, v = rand_qkv(2, 1, 5, 7, 11, dtype=torch.float64, seed=8)
    q3, k3, v3 = (t[:, 0] for t in (q, k, v))
    mask3 = _bool_mask((2, 5, 7), seed=9)
    expected3 = F.scaled_dot_product_attention(q3, k3, v3, attn_mask=mask3)
    torch.testing.assert_close(oracle(q3, k3, v3, mask=mask3), expected3, **TIGHT)
    q2, k2, v2 = (t[0] for t in (q3, k3, v3))
    expected2 = F.scaled_dot_product_attention(q2, k2, v2, is_causal=True)
    torch.testing.assert_close(oracle(q2, k2, v2, mask=masks.causal(align="top_left")), expected2, **TIGHT)


def test_weights_and_lse_equal_their_definitions():
    q, k, v = rand_qkv(2, 3, 5, 7, 11, dtype=torch.float64, seed=10)
    mask = _bool_mask((2, 3, 5, 7), seed=11)
    res = oracle(q, k, v, mask=mask, return_weights=True, return_lse=True)
    scores = (q @ k.transpose(-1, -2) / math.sqrt(11)).masked_fill(~mask, -math.inf)
    torch.testing.assert_close(res.weights, torch.softmax(scores, -1), **TIGHT)
    torch.testing.assert_close(res.lse, torch.logsumexp(scores, -1), **TIGHT)
    torch.testing.assert_close(res.output, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), **TIGHT)


def test_rows_without_keys_give_zero_and_minus_inf_lse():
    q, k, v = rand_qkv(2, 3, 9, 4, 5, dtype=torch.float64, seed=12)
    res = oracle(q, k, v, mask=masks.causal(), return_lse=True, return_weights=True)  # bottom-right: 5 empty rows
    assert torch.equal(res.output[:, :, :5], torch.zeros(2, 3, 5, 5, dtype=torch.float64))
    assert torch.isneginf(res.lse[:, :, :5]).all() and torch.isfinite(res.lse[:, :, 5:]).all()
    assert not res.weights[:, :, :5].any()
    bias = torch.zeros(9, 4, dtype=torch.float64)
    bias[6] = -math.inf  # a row emptied by the bias follows the same rule
    out = oracle(q, k, v, bias=bias)
    assert torch.equal(out[:, :, 6], torch.zeros(2, 3, 5, dtype=torch.float64)) and out.isfinite().all()


def test_nan_propagates_and_padding_keys_are_zeroed():
    q, k, v = rand_qkv(2, 3, 5, 7, 4, dtype=torch.float64, seed=13)
    k[:, :, 6], v[:, :, 6] = math.nan, math.inf  # past sample 1's length: never reaches its rows
    got = oracle(q, k, v, mask=masks.padding([7, 6]))
    assert torch.isnan(got[0]).all() and got[1].isfinite().all()  # sample 0 attends key 6
    q[0, 1, 2, 0] = math.nan
    got = oracle(q, k, v, mask=masks.padding([6, 6]))
    nan = torch.zeros(2, 3, 5, 4, dtype=torch.bool)
    nan[0, 1, 2] = True
    assert torch.equal(got.isnan(), nan)


def test_rejects_what_it_does_not_model():
    q, k, v = rand_qkv(dtype=torch.float64)
    with pytest.raises(NotImplementedError):
        oracle(q, k, v, dropout_p=0.1)
    with pytest.raises(NotImplementedError):
        oracle(q, k, v, normalize="gumbel")


# ------------------------------------------------------------------ against the reference kernel
MASKS = {
    "causal-bottom-right": masks.causal(),
    "window": masks.sliding_window(3, 1),
    "dilated": masks.dilated(2, 3),
    "strided&causal": masks.strided(3) & masks.causal(),
    "fixed": masks.fixed(4, 2),
    "global|window": masks.global_tokens([0, 9]) | masks.sliding_window(1, 1),
    "padding": masks.padding([11, 4]),
    "causal&padding": masks.causal() & masks.padding([0, 8]),
    "segments": masks.segments(torch.arange(11) // 4, torch.arange(13) // 4),
    "prefix": masks.prefix_lm(3),
    "not-window": ~masks.sliding_window(2, 2),
    "by-head": masks.from_function(lambda b, h, i, j: (i + j + h) % 3 != 0, "by_head"),
    "keys": masks.keys(torch.rand(2, 13, generator=torch.Generator().manual_seed(0)) < 0.7),
}


@pytest.mark.parametrize("name", list(MASKS))
def test_mask_objects_equal_the_reference_kernel(name):
    q, k, v = rand_qkv(2, 3, 11, 13, 5, 6, dtype=torch.float64, seed=14)
    kw = {"mask": MASKS[name], "return_weights": True, "return_lse": True}
    got, exp = oracle(q, k, v, **kw), _reference(q, k, v, **kw)
    for a, b in zip(got, exp, strict=True):
        torch.testing.assert_close(a, b, **TIGHT)


def _relpos(mode):
    mod = RelativePositionBias(3, mode=mode, num_buckets=8, max_distance=4)
    with torch.no_grad():
        mod.table.copy_(torch.randn(mod.table.shape, generator=torch.Generator().manual_seed(15)))
    return mod


BIASES = {
    "alibi": lambda: ALiBi(3),
    "alibi-top-left": lambda: ALiBi(3, align="top_left"),
    "relpos-t5": lambda: _relpos("t5"),
    "relpos-clip": lambda: _relpos("clip"),
    "softcap": lambda: Softcap(2.0),
    "callable": lambda: (lambda s, b, h, i, j: s - 0.1 * (i - j).abs() * (h + 1)),
    "tensor": lambda: torch.randn(3, 11, 13, generator=torch.Generator().manual_seed(16), dtype=torch.float64),
    "tensor-keys": lambda: torch.randn(2, 1, 1, 13, generator=torch.Generator().manual_seed(17), dtype=torch.float64),
}


@pytest.mark.parametrize("name", list(BIASES))
@pytest.mark.parametrize("mask", [None, "causal"])
def test_biases_and_modifiers_equal_the_reference_kernel(name, mask):
    q, k, v = rand_qkv(2, 3, 11, 13, 5, dtype=torch.float64, seed=18)
    q = q * 3  # scores past the soft cap
    kw = {"bias": BIASES[name](), "mask": masks.causal() if mask else None, "return_lse": True}
    got, exp = oracle(q, k, v, **kw), _reference(q, k, v, **kw)
    torch.testing.assert_close(got.output, exp.output, **TIGHT)
    torch.testing.assert_close(got.lse, exp.lse, **TIGHT)


@pytest.mark.parametrize("score", ["dot", "cosine", "callable"])
@pytest.mark.parametrize("scale", [None, 0.7])
def test_scores_and_scales_equal_the_reference_kernel(score, scale):
    q, k, v = rand_qkv(2, 3, 11, 13, 5, dtype=torch.float64, seed=19)
    fn = (lambda a, b: -torch.cdist(a, b)) if score == "callable" else score
    kw = {"score": fn, "scale": scale, "mask": masks.sliding_window(4, 1), "bias": ALiBi(3)}
    torch.testing.assert_close(oracle(q, k, v, **kw), _reference(q, k, v, **kw), **TIGHT)


@pytest.mark.parametrize("normalize", ["sparsemax", "sigmoid", "hard", "callable"])
@pytest.mark.parametrize("mask", [None, "window&padding"])
def test_normalisers_equal_the_reference_kernel(normalize, mask):
    q, k, v = rand_qkv(2, 3, 11, 13, 5, dtype=torch.float64, seed=20)
    q = q * 2  # sparse sparsemax rows
    fn = (lambda s, allowed: torch.relu(s)) if normalize == "callable" else normalize
    m = masks.sliding_window(3, 3) & masks.padding([13, 2]) if mask else None
    kw = {"normalize": fn, "mask": m, "return_weights": True}
    got, exp = oracle(q, k, v, **kw), _reference(q, k, v, **kw)
    torch.testing.assert_close(got.output, exp.output, **TIGHT)
    torch.testing.assert_close(got.weights, exp.weights, **TIGHT)


def test_sparsemax_is_the_simplex_projection():
    z = torch.tensor([[1.0, 0.6, -1.0, 0.1], [2.0, 0.0, 0.0, 0.0], [0.2, 0.2, 0.2, 0.2]], dtype=torch.float64)
    w = dense_attention(torch.eye(4, dtype=torch.float64)[:3], torch.eye(4, dtype=torch.float64),
                        torch.eye(4, dtype=torch.float64), score=lambda a, b: z[None, None], normalize="sparsemax")
    expected = torch.tensor([[0.7, 0.3, 0, 0], [1, 0, 0, 0], [0.25, 0.25, 0.25, 0.25]], dtype=torch.float64)
    torch.testing.assert_close(w, expected, **TIGHT)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_oracle_answers_in_float64_whatever_the_input_dtype(dtype):
    q, k, v = rand_qkv(2, 3, 5, 7, 11, dtype=dtype, seed=21)
    got = oracle(q, k, v, mask=masks.causal())
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, _reference(q.double(), k.double(), v.double(), mask=masks.causal()), **TIGHT)
