"""RELIABILITY.md, the "E" rows for ``attnkit.attention``: bad input raises an attnkit error naming the argument.

Rows covered here: 9-12, 14, 15, 18 (no bare bool causal), 25 (non-finite scale), 32, 34, 49, 50, and
decision 9 (validation runs before dispatch, so every forced backend raises the same error).
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

import attnkit
from attnkit import ArgumentError, AttnkitError, BackendError, DeviceError, DTypeError, ShapeError, masks
from tests.helpers import BACKENDS, rand_qkv

WINDOW = masks.sliding_window(2, 1)  # a mask every backend (blocksparse included) accepts


def _call(q, k, v, **kwargs):
    return attnkit.attention(q, k, v, **kwargs)


# ----------------------------------------------------------------- rows 9, 10: masks are bool, biases float
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.int64, torch.int32,
                                   torch.uint8])
def test_non_bool_tensor_as_mask_raises(dtype):
    q, k, v = rand_qkv()
    with pytest.raises(DTypeError, match=rf"mask must be a bool tensor.*got dtype {dtype}"):
        _call(q, k, v, mask=torch.ones(7, dtype=dtype))


def test_float_mask_error_points_to_bias():
    q, k, v = rand_qkv()
    with pytest.raises(DTypeError, match=r"mask .*pass them as bias="):
        _call(q, k, v, mask=torch.zeros(5, 7))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.uint8])
def test_a_mask_of_zeros_and_ones_is_told_both_polarities(dtype):
    """A 0/1 keep-mask (float, or int as transformers' attention_mask) added as a bias would mask nothing: the error
    says how to make it bool either way round."""
    q, k, v = rand_qkv()
    ones = torch.ones(5, 7).tril().to(dtype)
    with pytest.raises(DTypeError, match=r"mask=m\.bool\(\) if 1 marks the keys to attend, mask=\(m == 0\) if"):
        _call(q, k, v, mask=ones)


def test_a_float_mask_of_minus_inf_points_to_bias_only():
    q, k, v = rand_qkv()
    bias = torch.zeros(5, 7).masked_fill(torch.ones(5, 7, dtype=torch.bool).triu(1), float("-inf"))
    with pytest.raises(DTypeError, match=r"pass them as bias=\)$"):
        _call(q, k, v, mask=bias)


def test_a_mask_expression_as_text_points_to_parse():
    q, k, v = rand_qkv()
    with pytest.raises(DTypeError, match=r"got str \(a mask expression is built with attnkit\.masks\.parse"):
        _call(q, k, v, mask="causal() & sliding_window(2)")


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.uint8])
def test_non_float_tensor_as_bias_raises(dtype):
    q, k, v = rand_qkv()
    with pytest.raises(DTypeError, match=rf"bias must be a floating tensor; got dtype {dtype}"):
        _call(q, k, v, bias=torch.ones(5, 7, dtype=dtype))


def test_bool_bias_error_points_to_mask():
    q, k, v = rand_qkv()
    with pytest.raises(DTypeError, match=r"bias .*pass them as mask="):
        _call(q, k, v, mask=torch.ones(7, dtype=torch.bool), bias=torch.ones(7, dtype=torch.bool))


@pytest.mark.parametrize("mask", [True, 1, [[True] * 7] * 5, "causal"], ids=["bool", "int", "list", "str"])
def test_non_tensor_mask_raises(mask):
    """Row 18: there is no bare ``is_causal=True``; alignment comes from ``masks.causal(align=...)``."""
    q, k, v = rand_qkv()
    with pytest.raises(DTypeError, match=r"mask must be an attnkit.masks.Mask or a bool tensor"):
        _call(q, k, v, mask=mask)


# ----------------------------------------------------------------- row 11: only documented mask shapes
@pytest.mark.parametrize(("lq", "shape"), [
    (7, (2, 1, 7, 1)),  # (B,1,L,1) instead of (B,1,1,S): silently wrong elsewhere when L == S
    (5, (7, 5)),  # (S, L) transposed
    (5, (2, 1, 1, 6)),  # key dim off by one
    (5, (3, 1, 1, 7)),  # batch 3 for batch 2
    (5, (2, 4, 5, 7)),  # 4 heads for 3
    (5, (1, 2, 3, 5, 7)),  # rank above the inputs' rank
    (5, (5,)),  # (L,) instead of (S,)
])
def test_wrong_mask_shape_raises(lq, shape):
    q, k, v = rand_qkv(lq=lq)
    got = str(shape).replace("(", r"\(").replace(")", r"\)").replace(",)", ")")
    with pytest.raises(ShapeError, match=rf"mask must broadcast to the scores .*got {got}"):
        _call(q, k, v, mask=torch.ones(shape, dtype=torch.bool))


def test_wrong_bias_shape_raises():
    q, k, v = rand_qkv(lq=7)
    with pytest.raises(ShapeError, match=r"bias must broadcast to the scores \(2, 3, 7, 7\).*got \(2, 1, 7, 1\)"):
        _call(q, k, v, bias=torch.zeros(2, 1, 7, 1))


@pytest.mark.parametrize(("mask", "what"), [
    (masks.padding([1, 2, 3]), r"batch size 3; got batch 2"),
    (masks.segments(torch.zeros(3, 7, dtype=torch.long)), r"batch size 3; got batch 2"),
    (masks.block_layout(torch.ones(4, 1, 1, dtype=torch.bool), 8), r"4 heads; got 3 heads"),
])
def test_mask_object_tied_to_other_sizes_raises(mask, what):
    q, k, v = rand_qkv(lq=7)
    with pytest.raises(ShapeError, match=rf"mask .*{what}"):
        _call(q, k, v, mask=mask)


# ----------------------------------------------------------------- row 12: batch sizes cross-checked
@pytest.mark.parametrize("which", [0, 1, 2], ids=["query", "key", "value"])
def test_batch_mismatch_names_each_tensor(which):
    qkv = list(rand_qkv())
    qkv[which] = qkv[which][:1]
    shapes = [str(tuple(t.shape)).replace("(", r"\(").replace(")", r"\)") for t in qkv]
    with pytest.raises(ShapeError, match=rf"batch dims differ: query {shapes[0]}, key {shapes[1]}, value {shapes[2]}"):
        _call(*qkv)


def test_feature_dim_mismatch_names_query_and_key():
    q, k, v = rand_qkv()
    with pytest.raises(ShapeError, match=r"query and key must share the feature dim.*D=11.*key.*D=5"):
        _call(q, k[..., :5], v)


# ----------------------------------------------------------------- row 14: dtype and device mixes
@pytest.mark.parametrize("which", [0, 1, 2], ids=["query", "key", "value"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_dtype_mix_raises(which, dtype):
    qkv = list(rand_qkv())
    qkv[which] = qkv[which].to(dtype)
    names = [str(t.dtype) for t in qkv]
    with pytest.raises(DTypeError, match=rf"query, key and value must share a dtype; got {', '.join(names)}"):
        _call(*qkv)


@pytest.mark.parametrize("which", [0, 1, 2], ids=["query", "key", "value"])
def test_integer_or_non_tensor_input_raises(which):
    name = ("query", "key", "value")[which]
    qkv = list(rand_qkv())
    qkv[which] = qkv[which].long()
    with pytest.raises(DTypeError, match=rf"{name} must be a floating tensor; got dtype torch.int64"):
        _call(*qkv)
    qkv[which] = qkv[which].tolist()
    with pytest.raises(DTypeError, match=rf"{name} must be a torch.Tensor; got list"):
        _call(*qkv)


@pytest.mark.parametrize("which", [0, 1, 2], ids=["query", "key", "value"])
def test_device_mix_raises(which):
    qkv = list(rand_qkv())
    qkv[which] = qkv[which].to("meta")
    with pytest.raises(DeviceError, match=r"query, key and value must share a device; got .*meta"):
        _call(*qkv)


@pytest.mark.parametrize("arg", ["mask", "bias"])
def test_mask_or_bias_on_other_device_raises(arg):
    q, k, v = rand_qkv()
    t = torch.ones(7, dtype=torch.bool if arg == "mask" else torch.float32, device="meta")
    with pytest.raises(DeviceError, match=rf"{arg} is on meta but query is on cpu"):
        _call(q, k, v, **{arg: t})


# ----------------------------------------------------------------- row 15: ranks
@pytest.mark.parametrize("ranks", [(1, 1, 1), (5, 5, 5), (4, 3, 3), (3, 4, 4), (4, 4, 3), (2, 3, 3), (3, 3, 2)])
def test_wrong_or_mixed_rank_raises(ranks):
    q, k, v = rand_qkv()
    full = {1: lambda t: t[0, 0, 0], 2: lambda t: t[0, 0], 3: lambda t: t[:, 0], 4: lambda t: t,
            5: lambda t: t[None]}
    with pytest.raises(ShapeError, match=r"must all be 2-D \(L, D\), 3-D \(B, L, D\) or 4-D \(B, H, L, D\); got"):
        _call(full[ranks[0]](q), full[ranks[1]](k), full[ranks[2]](v))


# ----------------------------------------------------------------- row 25: scale
@pytest.mark.parametrize("scale", [float("nan"), float("inf"), float("-inf"), "0.5", True, torch.tensor(0.5)],
                         ids=["nan", "inf", "-inf", "str", "bool", "tensor"])
def test_invalid_scale_raises(scale):
    q, k, v = rand_qkv()
    with pytest.raises(ArgumentError, match=r"scale must be a finite real number or None; got"):
        _call(q, k, v, scale=scale)


# ----------------------------------------------------------------- row 32: grouped-query head counts
@pytest.mark.parametrize(("h", "hkv"), [(6, 4), (3, 2), (3, 0), (2, 3)])
def test_query_heads_not_multiple_of_kv_heads_raises(h, hkv):
    q, k, v = rand_qkv(h=h, hkv=hkv)
    with pytest.raises(ShapeError, match=rf"got {h} query heads and {hkv} key/value heads"):
        _call(q, k, v)


def test_key_and_value_head_counts_differ_raises():
    q, k, v = rand_qkv(h=6, hkv=2)
    with pytest.raises(ShapeError, match=r"key and value must have the same number of heads; got 2 and 1"):
        _call(q, k, v[:, :1])


# ----------------------------------------------------------------- row 34: dropout_p
@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5, float("nan"), float("inf"), 9.88e-324, 5e-324, True, "0.1"],
                         ids=["neg", "one", "above", "nan", "inf", "fuzz-denormal", "min-denormal", "bool", "str"])
def test_invalid_dropout_raises(p):
    q, k, v = rand_qkv()
    with pytest.raises(ArgumentError, match=r"dropout_p must be 0 or a normal float in \(0, 1\); got"):
        _call(q, k, v, dropout_p=p)


# ----------------------------------------------------------------- row 49: key/value lengths
def test_key_value_length_mismatch_names_both():
    q, k, v = rand_qkv()
    with pytest.raises(ShapeError, match=r"key and value must have the same length; got key .*Lk=7.*value .*Lv=6"):
        _call(q, k, v[:, :, :6])


# ----------------------------------------------------------------- row 50: a forced backend never drops an argument
def _nan_q():
    q, k, v = rand_qkv()
    q[0, 1, 2, 3] = float("nan")
    return q, k, v


def _inf_k():
    q, k, v = rand_qkv(lq=7)
    k[:, :, 6] = float("inf")  # masked by the causal mask below, still refused: torch leaks it
    return q, k, v


REFUSALS = [
    ("sdpa", rand_qkv, {"bias": torch.zeros(5, 7)}),
    ("sdpa", rand_qkv, {"bias": attnkit.bias.Softcap(5.0)}),
    ("sdpa", rand_qkv, {"score": "cosine"}),
    ("sdpa", rand_qkv, {"normalize": "sparsemax"}),
    # lse with a gradient (without one, torch-sdpa returns the CPU kernel's own lse)
    ("sdpa", partial(rand_qkv, requires_grad=True), {"return_lse": True}),
    ("sdpa", rand_qkv, {"return_weights": True}),
    ("sdpa", _nan_q, {}),
    ("sdpa", _inf_k, {"mask": masks.causal()}),
    ("chunked", rand_qkv, {"normalize": "sparsemax"}),
    ("chunked", rand_qkv, {"return_weights": True}),
    ("blocksparse", rand_qkv, {"mask": WINDOW, "return_weights": True}),
    ("blocksparse", rand_qkv, {"mask": WINDOW, "normalize": lambda s, allowed: torch.softmax(s, -1)}),
]


@pytest.mark.parametrize(("backend", "make", "kwargs"), REFUSALS,
                         ids=[f"{b}-{i}" for i, (b, _, _) in enumerate(REFUSALS)])
def test_forced_backend_that_cannot_honour_raises(backend, make, kwargs):
    q, k, v = make()
    with pytest.raises(BackendError, match=rf"backend='{backend}' cannot honour this call: \w"):
        _call(q, k, v, backend=backend, **kwargs)


def test_auto_takes_every_call_a_forced_backend_refuses():
    for _, make, kwargs in REFUSALS:
        q, k, v = make()
        res = _call(q, k, v, **kwargs)
        out = res[0] if isinstance(res, tuple) else res
        assert out.shape == (2, 3, q.shape[2], 11)


def test_unknown_backend_raises():
    q, k, v = rand_qkv()
    with pytest.raises(ArgumentError, match=r"backend must be one of .*got 'flash'"):
        _call(q, k, v, backend="flash")


# ----------------------------------------------------------------- decision 9: validate once, before dispatch
BAD_CALLS = [
    (DTypeError, {"mask": torch.ones(5, 7)}),
    (ShapeError, {"mask": torch.ones(2, 1, 5, 1, dtype=torch.bool)}),
    (ArgumentError, {"scale": float("nan")}),
    (ArgumentError, {"dropout_p": 1.0}),
    (DTypeError, {"bias": torch.ones(5, 7, dtype=torch.bool)}),
]


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
@pytest.mark.parametrize(("error", "kwargs"), BAD_CALLS, ids=[f"{e.__name__}{i}" for i, (e, _) in enumerate(BAD_CALLS)])
def test_every_backend_sees_the_same_validation(backend, error, kwargs):
    q, k, v = rand_qkv()
    with pytest.raises(error) as info:
        _call(q, k, v, backend=backend, **kwargs)
    assert isinstance(info.value, AttnkitError)
    assert isinstance(info.value, (ValueError, TypeError))
    assert not isinstance(info.value, BackendError)


# ----------------------------------------------------------------- rows 9, 11, 18 at the attnkit.masks constructors
MASK_ARG_ERRORS = [
    (lambda: masks.causal("bottom-right"), ValueError, r"align must be one of .*got 'bottom-right'"),
    (lambda: masks.causal(True), ValueError, r"align must be one of .*got True"),
    (lambda: masks.sliding_window(-1), ValueError, r"left must be an int >= 0; got -1"),
    (lambda: masks.sliding_window(2, 2.5), ValueError, r"right must be an int >= 0; got 2.5"),
    (lambda: masks.padding([3, -1]), ValueError, r"lengths must be >= 0"),
    (lambda: masks.padding(torch.tensor([1.5])), TypeError, r"lengths must hold integer positions"),
    (lambda: masks.keys(torch.ones(7)), TypeError, r"keep must be a bool tensor .*float32"),
    (lambda: masks.keys(torch.ones(7, dtype=torch.uint8)), TypeError, r"keep must be a bool tensor .*uint8"),
    (lambda: masks.keys(torch.ones(1, 2, 7, dtype=torch.bool)), ValueError, r"keep must have shape .*\(1, 2, 7\)"),
    (lambda: masks.causal() & torch.ones(7, dtype=torch.bool), TypeError, r"combine only with other attnkit masks"),
    (lambda: masks.padding([1, 2]) & masks.padding([1, 2, 3]), ValueError, r"disagree on batch_size: \[2, 3\]"),
]
MASK_IDS = ["align", "align-bool", "left", "right", "lengths", "lengths-float", "keys-float", "keys-uint8",
            "keys-rank", "and-tensor", "and-batch"]


@pytest.mark.parametrize(("make", "error", "match"), MASK_ARG_ERRORS, ids=MASK_IDS)
def test_mask_constructor_errors_name_the_argument(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize(("make", "error", "match"), MASK_ARG_ERRORS, ids=MASK_IDS)
def test_mask_constructor_errors_are_attnkit_errors(make, error, match):
    with pytest.raises(AttnkitError):
        make()
