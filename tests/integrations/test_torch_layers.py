"""attnkit's MultiHeadAttention inside torch's Transformer layers: torch's outputs in every mode and mask combination.

Each layer is compared with the same torch layer holding torch's module, in float64 at
1e-10: in training (dropout 0), in eval, and in eval under ``no_grad`` and
``inference_mode``, where torch's own layers take their fused "fast path" (and
``TransformerEncoder`` passes nested tensors), while attnkit's module must still be called.
"""

from __future__ import annotations

import contextlib
import copy
import io
import itertools

import pytest
import torch
from torch import nn

from attnkit.errors import ArgumentError, ShapeError
from attnkit.nn.multihead import MultiHeadAttention
from tests.helpers import randomized_float64

E, HEADS, FF, N, L, S = 16, 4, 24, 2, 5, 7  # an even head count: torch's fused path is eligible
MODES = ("train", "eval", "no_grad", "inference_mode")
TOL = {"atol": 1e-10, "rtol": 1e-10}
F64 = torch.float64






def _with_attnkit(layer):
    ours = copy.deepcopy(layer)
    for name in ("self_attn", "multihead_attn"):
        if hasattr(ours, name):
            setattr(ours, name, MultiHeadAttention.from_torch(getattr(layer, name)))
    return ours


def _run(module, mode, *args, **kwargs):
    module.train(mode == "train")
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}.get(mode, contextlib.nullcontext)
    with context():
        return module(*args, **kwargs)


def _torchs_output(layer, mode, *args, **kwargs):
    """torch's layer in ``mode``; where its fused path returns NaN (a float (N*H, L, L) mask holding -inf, seen
    on torch 2.13) the function it computes elsewhere: the same layer in eval with autograd on, finite."""
    out = _run(layer, mode, *args, **kwargs)
    if mode in ("no_grad", "inference_mode") and out.isnan().any():
        out = _run(layer, "eval", *args, **kwargs)
        assert not out.isnan().any()
    return out


def _x(length, batch_first, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, length, E, generator=g, dtype=F64)
    return x if batch_first else x.transpose(0, 1)


def _padding(length, kind="bool"):
    pad = torch.zeros(N, length, dtype=torch.bool)
    pad[1, length - 2:] = True  # the second sequence is two shorter; key 0 stays open to every query
    return pad if kind == "bool" else torch.zeros(N, length, dtype=F64).masked_fill(pad, float("-inf"))


def _causal(length, kind):
    if kind == "float":
        return nn.Transformer.generate_square_subsequent_mask(length, dtype=F64)
    return torch.ones(length, length, dtype=torch.bool).triu(1)


def _random_mask(lead, lq, s, kind, seed):
    """A random torch-polarity mask (True / -inf = ignore) that leaves key 0 open to every query."""
    g = torch.Generator().manual_seed(seed)
    ignore = torch.rand(*lead, lq, s, generator=g) < 0.35
    ignore[..., 0] = False
    return ignore if kind == "bool" else torch.randn(*lead, lq, s, generator=g, dtype=F64).masked_fill(
        ignore, float("-inf"))


ENCODER_MASKS = {
    "none": lambda: {},
    "bool padding": lambda: {"src_key_padding_mask": _padding(L)},
    "float padding": lambda: {"src_key_padding_mask": _padding(L, "float")},
    "float causal, is_causal hint": lambda: {"src_mask": _causal(L, "float"), "is_causal": True},
    "bool causal": lambda: {"src_mask": _causal(L, "bool")},
    "float causal beside bool padding": lambda: {"src_mask": _causal(L, "float"), "src_key_padding_mask": _padding(L),
                                                 "is_causal": True},
    "bool (N*H, L, L) beside bool padding": lambda: {"src_mask": _random_mask((N * HEADS,), L, L, "bool", 1),
                                                     "src_key_padding_mask": _padding(L)},
    "float (N*H, L, L)": lambda: {"src_mask": _random_mask((N * HEADS,), L, L, "float", 2)},
}


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_gives_torchs_outputs_in_every_mode_and_mask_combination(batch_first, norm_first):
    theirs = randomized_float64(nn.TransformerEncoderLayer(E, HEADS, FF, dropout=0.0, batch_first=batch_first,
                                                    norm_first=norm_first))
    ours = _with_attnkit(theirs)
    x = _x(L, batch_first, seed=3)
    for mode, (name, masks) in itertools.product(MODES, ENCODER_MASKS.items()):
        kwargs = masks()
        expected, got = _torchs_output(theirs, mode, x, **kwargs), _run(ours, mode, x, **kwargs)
        torch.testing.assert_close(got, expected, **TOL, msg=lambda m, mode=mode, name=name: f"{mode}, {name}: {m}")


DECODER_MASKS = {
    "none": lambda: {},
    "float causal beside bool paddings": lambda: {
        "tgt_mask": _causal(L, "float"), "tgt_is_causal": True, "tgt_key_padding_mask": _padding(L),
        "memory_key_padding_mask": _padding(S)},
    "bool causal, bool memory mask": lambda: {"tgt_mask": _causal(L, "bool"),
                                              "memory_mask": _random_mask((), L, S, "bool", 4)},
    "float (N*H, ...) masks": lambda: {"tgt_mask": _random_mask((N * HEADS,), L, L, "float", 5),
                                       "memory_mask": _random_mask((N * HEADS,), L, S, "float", 6)},
    "memory_is_causal hint with L != S": lambda: {  # a true hint: torch may then use either
        "memory_mask": torch.ones(L, S, dtype=torch.bool).triu(1), "memory_is_causal": True},
    "float memory mask beside bool memory padding": lambda: {"memory_mask": _random_mask((), L, S, "float", 8),
                                                             "memory_key_padding_mask": _padding(S)},
}


@pytest.mark.parametrize("batch_first", [True, False])
def test_decoder_layer_gives_torchs_outputs_in_every_mode_and_mask_combination(batch_first):
    theirs = randomized_float64(nn.TransformerDecoderLayer(E, HEADS, FF, dropout=0.0, batch_first=batch_first))
    ours = _with_attnkit(theirs)
    assert isinstance(ours.self_attn, MultiHeadAttention) and isinstance(ours.multihead_attn, MultiHeadAttention)
    tgt, memory = _x(L, batch_first, seed=4), _x(S, batch_first, seed=5)
    for mode, (name, masks) in itertools.product(MODES, DECODER_MASKS.items()):
        kwargs = masks()
        expected, got = _torchs_output(theirs, mode, tgt, memory, **kwargs), _run(ours, mode, tgt, memory, **kwargs)
        torch.testing.assert_close(got, expected, **TOL, msg=lambda m, mode=mode, name=name: f"{mode}, {name}: {m}")


def test_encoder_stack_passes_nested_tensors_and_gets_torchs_output():
    """TransformerEncoder packs a padded batch into nested tensors in eval without autograd."""
    layer = randomized_float64(nn.TransformerEncoderLayer(E, HEADS, FF, dropout=0.0, batch_first=True))
    theirs = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=True).to(F64)
    ours = copy.deepcopy(theirs)
    for mod in ours.layers:
        mod.self_attn = MultiHeadAttention.from_torch(mod.self_attn)
    seen = []
    ours.layers[0].self_attn.register_forward_pre_hook(lambda _, args: seen.append(args[0].is_nested))
    x, pad = _x(L, True, seed=6), _padding(L)
    for mode in MODES:
        torch.testing.assert_close(_run(ours, mode, x, src_key_padding_mask=pad),
                                   _run(theirs, mode, x, src_key_padding_mask=pad), **TOL)
    assert seen == [False, False, True, True]  # the nested path was really taken under no_grad / inference_mode


def test_the_fused_encoder_layer_is_declined(monkeypatch):
    """Under no_grad the layer calls the module; torch's module would go to the fused kernel instead."""
    theirs = randomized_float64(nn.TransformerEncoderLayer(E, HEADS, FF, dropout=0.0, batch_first=True)).eval()
    ours = _with_attnkit(theirs)
    expected = _run(theirs, "no_grad", _x(L, True, seed=7))

    def fused(*args, **kwargs):
        raise AssertionError("torch's fused encoder layer ran")
    monkeypatch.setattr(torch, "_transformer_encoder_layer_fwd", fused)
    with pytest.raises(AssertionError, match="fused encoder layer ran"):
        _run(theirs, "no_grad", _x(L, True, seed=7))
    torch.testing.assert_close(_run(ours, "no_grad", _x(L, True, seed=7)), expected, **TOL)


def test_grouped_query_heads_in_an_encoder_layer_under_no_grad_equal_the_autograd_call():
    """torch's fused kernel cannot read grouped K/V projections: the module must run itself."""
    layer = nn.TransformerEncoderLayer(E, HEADS, FF, dropout=0.0, batch_first=True, dtype=F64)
    layer.self_attn = MultiHeadAttention(E, HEADS, batch_first=True, num_kv_heads=2, dtype=F64)
    layer.eval()
    x, pad = _x(L, True, seed=8), _padding(L)
    torch.testing.assert_close(_run(layer, "no_grad", x, src_key_padding_mask=pad),
                               _run(layer, "eval", x, src_key_padding_mask=pad), **TOL)


def test_nested_inputs_need_the_same_layout_and_no_second_padding():
    mha = MultiHeadAttention(E, HEADS, batch_first=True, dtype=F64).eval()
    x = _x(L, True, seed=9)
    nested = torch.nested.nested_tensor([x[0], x[1, :3]])
    out, weights = mha(nested, nested, nested, need_weights=False)
    assert out.is_nested and weights is None
    for row, n, seq in zip(out.unbind(), (L, 3), x, strict=True):
        alone = mha(seq[None, :n], seq[None, :n], seq[None, :n], need_weights=False)[0][0]
        torch.testing.assert_close(row, alone, **TOL)
    cases = [((nested, x, x), {}, ShapeError, "must all be nested tensors or none"),
             ((nested,) * 3, {"key_padding_mask": _padding(L)}, ArgumentError, "carry their own padding"),
             ((nested,) * 3, {"need_weights": True}, ArgumentError, "need_weights False")]
    for args, kwargs, error, match in cases:
        with pytest.raises(error, match=match):
            mha(*args, **({"need_weights": False} | kwargs))
    seq_first = MultiHeadAttention(E, HEADS, dtype=F64)
    with pytest.raises(ShapeError, match="batch_first=True"):
        seq_first(nested, nested, nested, need_weights=False)


def test_a_pickled_layer_keeps_declining_the_fused_path_and_its_mask():
    from attnkit import masks
    layer = nn.TransformerEncoderLayer(E, HEADS, FF, dropout=0.0, batch_first=True, dtype=F64)
    layer.self_attn = MultiHeadAttention(E, HEADS, batch_first=True, dtype=F64, mask=masks.sliding_window(1, 1))
    buffer = io.BytesIO()
    torch.save(layer, buffer)
    old = layer.self_attn.__getstate__()  # as pickled before the mask and the hook existed
    del old["extra_mask"]
    old["_forward_pre_hooks"] = type(old["_forward_pre_hooks"])()
    restored = MultiHeadAttention.__new__(MultiHeadAttention)
    restored.__setstate__(old)
    assert restored.extra_mask is None and len(restored._forward_pre_hooks) == 1
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False).eval()
    assert repr(loaded.self_attn.extra_mask) == repr(layer.self_attn.extra_mask)
    x = _x(L, True, seed=10)
    torch.testing.assert_close(_run(loaded, "no_grad", x), _run(layer.eval(), "eval", x), **TOL)
