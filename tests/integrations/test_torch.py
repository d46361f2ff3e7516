"""replace_attention: every torch.nn.MultiheadAttention of a model swapped for attnkit's, its outputs unchanged."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from attnkit import masks
from attnkit.errors import ArgumentError, DTypeError
from attnkit.integrations.torch import replace_attention
from attnkit.nn.multihead import MultiHeadAttention
from tests.helpers import randomized_float64

E, HEADS, FF, N, L, S = 16, 4, 24, 2, 6, 9
F64 = torch.float64
TOL = {"atol": 1e-10, "rtol": 1e-10}


def _x(length, seed, batch_first=True):
    x = torch.randn(N, length, E, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return x if batch_first else x.transpose(0, 1)


def _padding(length):
    pad = torch.zeros(N, length, dtype=torch.bool)
    pad[1, length - 2:] = True
    return pad




def _torch_modules(model):
    return [m for m in model.modules() if type(m) is nn.MultiheadAttention]


def _same_outputs(before, after, call):
    for mode in ("train", "eval", "no_grad"):
        for model in (before, after):
            model.train(mode == "train")
        with torch.no_grad() if mode == "no_grad" else torch.enable_grad():
            torch.testing.assert_close(call(after), call(before), **TOL, msg=lambda m, mode=mode: f"{mode}: {m}")


@pytest.mark.parametrize("batch_first", [True, False])
def test_an_encoder_computes_the_same_after_replacement(batch_first):
    layer = nn.TransformerEncoderLayer(E, HEADS, FF, dropout=0.0, batch_first=batch_first)
    before = randomized_float64(nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=batch_first))
    after = copy.deepcopy(before)
    assert replace_attention(after) == 2
    assert not _torch_modules(after) and all(isinstance(m.self_attn, MultiHeadAttention) for m in after.layers)
    x, pad = _x(L, 1, batch_first), _padding(L)
    _same_outputs(before, after, lambda m: m(x, src_key_padding_mask=pad))
    causal = nn.Transformer.generate_square_subsequent_mask(L, dtype=F64)
    _same_outputs(before, after, lambda m: m(x, mask=causal, is_causal=True))


def test_a_decoder_computes_the_same_after_replacement():
    layer = nn.TransformerDecoderLayer(E, HEADS, FF, dropout=0.0, batch_first=True)
    before = randomized_float64(nn.TransformerDecoder(layer, num_layers=2))
    after = copy.deepcopy(before)
    assert replace_attention(after) == 4  # self- and cross-attention in each layer
    tgt, memory = _x(L, 2), _x(S, 3)
    kwargs = dict(tgt_mask=nn.Transformer.generate_square_subsequent_mask(L, dtype=F64), tgt_is_causal=True,
                  tgt_key_padding_mask=_padding(L), memory_key_padding_mask=_padding(S))
    _same_outputs(before, after, lambda m: m(tgt, memory, **kwargs))


class Custom(nn.Module):
    """Attention at several depths, one module shared by two parents, a subclass, a frozen weight."""

    class Tagged(nn.MultiheadAttention):
        pass

    def __init__(self):
        super().__init__()
        shared = nn.MultiheadAttention(E, HEADS, batch_first=True)
        self.blocks = nn.ModuleList([nn.ModuleDict({"attn": shared}), nn.ModuleDict({"attn": shared})])
        self.cross = nn.Sequential(nn.Identity(), nn.MultiheadAttention(E, 2, kdim=5, vdim=7, bias=False,
                                                                        add_bias_kv=True, add_zero_attn=True))
        self.tagged = Custom.Tagged(E, 2, batch_first=True)

    def forward(self, x, memory_k, memory_v):
        for block in self.blocks:
            x = x + block["attn"](x, x, x, need_weights=False)[0]
        out, weights = self.cross[1](x.transpose(0, 1), memory_k, memory_v)  # sequence first
        return out.transpose(0, 1) + self.tagged(x, x, x)[0], weights


def test_a_custom_model_keeps_sharing_subclasses_frozen_weights_and_its_outputs():
    before = randomized_float64(Custom())
    before.cross[1].out_proj.weight.requires_grad_(False)
    after = copy.deepcopy(before)
    assert replace_attention(after) == 2  # the shared module once, the cross-attention; not the subclass
    assert after.blocks[0]["attn"] is after.blocks[1]["attn"]
    assert isinstance(after.blocks[0]["attn"], MultiHeadAttention) and type(after.tagged) is Custom.Tagged
    new = after.cross[1]
    assert isinstance(new, MultiHeadAttention) and not new.out_proj.weight.requires_grad
    assert all(p.dtype == F64 for p in after.parameters())
    g = torch.Generator().manual_seed(4)
    x = torch.randn(N, L, E, generator=g, dtype=F64)
    k, v = torch.randn(S, N, 5, generator=g, dtype=F64), torch.randn(S, N, 7, generator=g, dtype=F64)
    for part in (0, 1):  # the output, and the weights the cross-attention returns by default
        _same_outputs(before, after, lambda m, part=part: m(x, k, v)[part])


def test_gradients_through_the_replaced_model_equal_torchs():
    before = randomized_float64(nn.TransformerEncoder(nn.TransformerEncoderLayer(E, HEADS, FF, dropout=0.0), 1,
                                               enable_nested_tensor=False))
    after = copy.deepcopy(before)
    replace_attention(after)
    grads = []
    for model in (before, after):
        x = _x(L, 5, batch_first=False).requires_grad_()
        model(x, src_key_padding_mask=_padding(L)).square().sum().backward()
        grads.append([x.grad] + [p.grad for p in model.parameters()])
    for got, expected in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, expected, **TOL)


def test_an_extra_mask_is_anded_into_every_call():
    before = randomized_float64(nn.TransformerEncoderLayer(E, HEADS, FF, dropout=0.0, batch_first=True)).eval()
    after = copy.deepcopy(before)
    window = masks.sliding_window(2, 2)  # every row keeps an unpadded key: torch gives NaN otherwise
    assert replace_attention(after, mask=window) == 1 and after.self_attn.extra_mask is window
    x, pad = _x(L, 6), _padding(L)
    outside = ~window.materialize(L, L)  # torch's polarity: True = ignore
    with torch.no_grad():
        got = after(x, src_key_padding_mask=pad)
        torch.testing.assert_close(got, before(x, src_mask=outside, src_key_padding_mask=pad), **TOL)
        assert not torch.allclose(got, before(x, src_key_padding_mask=pad))  # the window matters here


def test_bad_arguments_raise_clear_errors():
    mha = nn.MultiheadAttention(E, HEADS)
    with pytest.raises(ArgumentError, match="from_torch"):
        replace_attention(mha)
    with pytest.raises(DTypeError, match=r"model must be a torch\.nn\.Module; got dict"):
        replace_attention({"attn": mha})
    with pytest.raises(DTypeError, match=r"mask must be an attnkit\.masks\.Mask or None; got Tensor"):
        replace_attention(nn.Sequential(mha), mask=torch.ones(3, 3, dtype=torch.bool))
    assert replace_attention(nn.Linear(2, 2)) == 0
