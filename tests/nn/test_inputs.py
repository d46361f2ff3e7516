"""nn/_inputs.py: the checks modules and models share (every module raises through them, naming itself,
the argument, what it expected and what it got) and the head split and merge."""

from __future__ import annotations

import pytest
import torch

from attnkit import masks
from attnkit.errors import ArgumentError, DeviceError, DTypeError, ShapeError
from attnkit.models import TransformerEncoder
from attnkit.nn import (
    AdditiveAttention,
    AttentionPooling,
    BigBirdAttention,
    CoAttention,
    CoverageAttention,
    DerivedKeyAttention,
    DSASparseAttention,
    HardAttention,
    LambdaLayer,
    LearnedPositionalEmbedding,
    LinearAttention,
    LinformerAttention,
    LocalAttention,
    LongformerAttention,
    LuongAttention,
    MemoryAttention,
    MoBA,
    NativeSparseAttention,
    PerceiverAttention,
    PerformerAttention,
    PointerAttention,
    ReformerAttention,
    SegmentAttention,
    SinusoidalPositionalEncoding,
    SparseTransformerAttention,
    TieredAttention,
)
from attnkit.nn._inputs import (
    check_keep_mask,
    check_key_mask,
    check_lengths,
    check_sequence,
    check_shape,
    merge_heads,
    split_heads,
)

B, N, M, D = 2, 5, 7, 6


def x(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype)


def test_check_sequence_names_who_what_and_what_came():
    with pytest.raises(DTypeError, match=r"^Mod: x must be a floating tensor; got torch.int64$"):
        check_sequence("Mod", "x", x(B, N, D, dtype=torch.long), D)
    with pytest.raises(DTypeError, match=r"got list"):
        check_sequence("Mod", "x", [1.0], D)
    with pytest.raises(ShapeError, match=r"^Mod: q must have shape \(batch=3, length, dim=6\); got \(2, 5, 6\)$"):
        check_sequence("Mod", "q", x(B, N, D), D, batch=3, length="length", named=True)
    check_sequence("Mod", "q", x(B, N, D), D, batch=B)


def test_a_module_input_on_the_wrong_device_or_dtype_is_named():
    model = TransformerEncoder(D, 2, 1)
    with pytest.raises(DTypeError, match=r"x must have the parameters' dtype torch.float32; got torch.float64"):
        model(x(B, N, D, dtype=torch.float64))
    with pytest.raises(DeviceError, match=r"x must be on the parameters' device meta; got cpu"):
        model.to("meta")(x(B, N, D))


def test_masks_and_lengths():
    assert check_keep_mask("Mod", "keep", None, B, N) is None
    with pytest.raises(DTypeError, match=r"Mod: keep must be a bool tensor \(True = real token\); got torch.float32"):
        check_keep_mask("Mod", "keep", x(B, N), B, N)
    with pytest.raises(ShapeError, match=r"keep must have shape \(batch, n\) = \(2, 5\); got \(5, 2\)"):
        check_keep_mask("Mod", "keep", torch.ones(N, B, dtype=torch.bool), B, N)
    assert check_key_mask("Mod", "mask", torch.ones(B, M, dtype=torch.bool), B, N, M).shape == (B, 1, M)
    causal = masks.causal()
    assert check_key_mask("Mod", "mask", causal, B, N, M, masks_too=True) is causal
    with pytest.raises(ShapeError, match=r"\(batch, n\) = \(2, 7\) or \(batch, Lq, n\) = \(2, 5, 7\); got \(2, 7, 5\)"):
        check_key_mask("Mod", "mask", torch.ones(B, M, N, dtype=torch.bool), B, N, M)
    with pytest.raises(ArgumentError, match=r"lengths must lie in \[0, 5\]; got \[1, 6\]"):
        check_lengths("Mod", "lengths", torch.tensor([1, 6]), B, N)
    with pytest.raises(ShapeError, match=r"never must be odd; got \(2,\)"):
        check_shape("Mod", "never", torch.zeros(2), lambda t: False, "be odd")


# module, the call with a (batch, n, width) input swapped in, the argument's name and the width
SEQUENCE_MODULES = [
    (LocalAttention(D, 2, 2), lambda m, t: m(t), "x", D),
    (LongformerAttention(D, 2, window=2), lambda m, t: m(t), "x", D),
    (BigBirdAttention(D, 2, block_size=2), lambda m, t: m(t), "x", D),
    (SparseTransformerAttention(D, 2, stride=2), lambda m, t: m(t), "x", D),
    (LinearAttention(D, 2), lambda m, t: m(t), "x", D),
    (PerformerAttention(D, 2), lambda m, t: m(t), "x", D),
    (LinformerAttention(D, 2, max_len=N), lambda m, t: m(t), "x", D),
    (ReformerAttention(D, 2), lambda m, t: m(t), "x", D),
    (LambdaLayer(D, key_dim=2, num_heads=2, max_len=N), lambda m, t: m(t), "x", D),
    (PerceiverAttention(D, 4, num_heads=2), lambda m, t: m(x(B, 3, D), t), "context", 4),
    (SinusoidalPositionalEncoding(D), lambda m, t: m(t), "x", D),
    (LearnedPositionalEmbedding(N, D), lambda m, t: m(t), "x", D),
    (AdditiveAttention(D, 4), lambda m, t: m(x(B, 3, D), t), "key", 4),
    (CoverageAttention(D, 4), lambda m, t: m(x(B, 3, D), t), "key", 4),
    (HardAttention(D, 4), lambda m, t: m(x(B, 3, D), t), "key", 4),
    (LuongAttention(D, 4), lambda m, t: m(x(B, 3, D), t), "memory", 4),
    (PointerAttention(4, D), lambda m, t: m(x(B, 3, D), t), "encoder", 4),
    (DerivedKeyAttention(4, D), lambda m, t: m(t, x(B, 3, D)), "value", 4),
    (MemoryAttention(D, 3), lambda m, t: m(t), "h", D),
    (AttentionPooling(D), lambda m, t: m(t), "x", D),
    (CoAttention(D, 4, 3), lambda m, t: m(x(B, 3, D), t), "image", 4),
    (SegmentAttention(D), lambda m, t: m(x(B, 3, D), t, torch.zeros(N, dtype=torch.long)), "x", D),
    (TieredAttention(D), lambda m, t: m(x(B, 3, D), t, torch.zeros(N, dtype=torch.long)), "x", D),
]


@pytest.mark.parametrize(("module", "call", "name", "width"), SEQUENCE_MODULES,
                         ids=[type(m).__name__ for m, *_ in SEQUENCE_MODULES])
def test_every_module_checks_its_sequence_input_through_the_shared_check(module, call, name, width):
    who = type(module).__name__
    call(module, x(B, N, width))  # the right input passes
    with pytest.raises(DTypeError, match=rf"^{who}: {name} must be a floating tensor; got torch.int64$"):
        call(module, x(B, N, width, dtype=torch.long))
    wrong = rf"^{who}: {name} must have shape \(batch.*{width}\); got \(2, 5, {width + 1}\)$"
    with pytest.raises(ShapeError, match=wrong):
        call(module, x(B, N, width + 1))


# The modules whose input is checked by ProjectedAttention.check_input or check_sequence(..., like=module)
SPARSE_AND_PROJECTED = [
    DSASparseAttention(D, 2, index_heads=2, index_dim=4, top_k=3),
    NativeSparseAttention(8, 4, kv_heads=2, compress_block=4, compress_stride=2, select_block=4, num_selected=2,
                          window=3),
    MoBA(D, 2, block_size=2, top_k=2),
    LocalAttention(D, 2, 2), BigBirdAttention(D, 2, block_size=2), SparseTransformerAttention(D, 2, stride=2),
    LinformerAttention(D, 2, max_len=N), LinearAttention(D, 2), PerformerAttention(D, 2), ReformerAttention(D, 2),
]


@pytest.mark.parametrize("module", SPARSE_AND_PROJECTED, ids=[type(m).__name__ for m in SPARSE_AND_PROJECTED])
def test_an_input_of_another_dtype_than_the_modules_raises_its_dtype_error(module):
    width = module.dim
    assert module(x(B, N, width)).shape == (B, N, width)
    with pytest.raises(DTypeError, match=rf"^{type(module).__name__}: x must have the parameters' dtype "
                                         r"torch.float32; got torch.float64$"):
        module(x(B, N, width, dtype=torch.float64))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts the input: accepted
        module(x(B, N, width, dtype=torch.bfloat16))


# Positional encodings add a table to x in x's own dtype: any floating dtype is theirs to take.
WITH_PARAMETERS = [case for case in SEQUENCE_MODULES
                   if not isinstance(case[0], SinusoidalPositionalEncoding | LearnedPositionalEmbedding)]


@pytest.mark.parametrize(("module", "call", "name", "width"), WITH_PARAMETERS,
                         ids=[type(m).__name__ for m, *_ in WITH_PARAMETERS])
def test_every_module_names_an_input_of_another_dtype_than_its_parameters(module, call, name, width):
    with pytest.raises(DTypeError, match=rf"^{type(module).__name__}: {name} must have the parameters' dtype "
                                         r"torch.float32; got torch.float64$"):
        call(module, x(B, N, width, dtype=torch.float64))


# ------------------------------------------------------------------ the head split and merge
def test_split_puts_each_heads_slice_of_the_width_before_the_length():
    x = torch.arange(2 * 5 * 6, dtype=torch.float64).reshape(2, 5, 6)
    parts = split_heads(x, 3)
    assert parts.shape == (2, 3, 5, 2)
    for h in range(3):  # head h holds columns [2h, 2h + 2) of every position
        assert torch.equal(parts[:, h], x[:, :, 2 * h:2 * h + 2])


def test_merge_undoes_split():
    x = torch.randn(3, 7, 12)
    assert torch.equal(merge_heads(split_heads(x, 4)), x)
