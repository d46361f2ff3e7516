"""The attention function transformers calls: each keyword honoured or refused, weights only when collected."""

import pytest
import torch
from transformers import GPT2LMHeadModel, MistralForCausalLM
from transformers import masking_utils as hf_masks

import attnkit
from attnkit import bias, masks
from attnkit.integrations.transformers import attention_function
from attnkit.integrations.transformers.attention_function import make_attention_function
from attnkit.integrations.transformers.model_masks import make_mask_function
from tests.oracle import dense_attention

from .helpers import tokens, twins
from .test_models import gpt2, mistral


class _Module(torch.nn.Module):
    is_causal = True


def _qkv(q_len=3, kv_len=5, heads=4, kv_heads=2, d=8):
    g = torch.Generator().manual_seed(3)
    return (torch.randn(2, heads, q_len, d, generator=g, dtype=torch.float64),
            torch.randn(2, kv_heads, kv_len, d, generator=g, dtype=torch.float64),
            torch.randn(2, kv_heads, kv_len, d, generator=g, dtype=torch.float64))


@pytest.fixture
def calls(monkeypatch):
    """Every attnkit.attention call the attention function makes: (mask, return_weights)."""
    seen = []
    real = attention_function.attention

    def spy(*args, **kwargs):
        seen.append((kwargs["mask"], kwargs["return_weights"]))
        return real(*args, **kwargs)
    monkeypatch.setattr(attention_function, "attention", spy)
    return seen


def test_output_layout_and_grouped_heads_against_the_oracle():
    q, k, v = _qkv()
    out, weights = make_attention_function()(_Module(), q, k, v, None, scaling=0.3)
    expected = dense_attention(q, k, v, mask=masks.causal(), scale=0.3)
    assert weights is None and out.shape == (2, 3, 4, 8)  # (B, Lq, H, Dv)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=0, atol=1e-12)


@pytest.mark.parametrize("keyword", ["s_aux", "sinks"])
def test_attention_sinks_pass_through_against_the_oracle(keyword):
    q, k, v = _qkv()
    sinks = torch.randn(4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    out, weights = make_attention_function()(_Module(), q, k, v, None, scaling=0.3, output_attentions=True,
                                             **{keyword: sinks})
    expected = dense_attention(q, k, v, mask=masks.causal(), scale=0.3, sinks=sinks, return_weights=True)
    torch.testing.assert_close(out, expected.output.transpose(1, 2), rtol=0, atol=1e-12)
    torch.testing.assert_close(weights, expected.weights, rtol=0, atol=1e-12)


def test_per_token_sinks_are_refused_naming_the_model():
    q, k, v = _qkv()
    with pytest.raises(attnkit.UnsupportedFeature, match=r"_Module.*per-token attention sinks"):
        make_attention_function()(_Module(), q, k, v, None, sinks=torch.zeros(2, 4, 3, 1))


def test_a_users_float_mask_longer_than_the_keys():
    q, k, v = _qkv()
    allowed = torch.rand(2, 1, 3, 8, generator=torch.Generator().manual_seed(0)) > 0.3
    allowed[..., 0] = True
    float_mask = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
    out, _ = make_attention_function()(_Module(), q, k, v, float_mask)
    expected = dense_attention(q, k, v, mask=allowed[..., :5])
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=0, atol=1e-12)
    additive = torch.randn(2, 1, 3, 5, dtype=torch.float64)  # not only 0 / min: a bias, as eager adds it
    out, _ = make_attention_function()(_Module(), q, k, v, additive)
    torch.testing.assert_close(out, dense_attention(q, k, v, bias=additive).transpose(1, 2), rtol=0, atol=1e-12)


@pytest.mark.parametrize("block", [(1, 9, 8, 0), (2, 9, 7, 0), (3, 6, 9, 6)], ids=str)
def test_registered_mask_and_bias_are_evaluated_on_whole_sequence_positions(block):
    # decoding, chunked prefill, and a sliding cache that kept only the last keys (the window reaches no further)
    q_len, kv_len, q_off, kv_off = block
    length = q_off + q_len
    extra_mask = masks.sliding_window(2) if kv_off else masks.global_tokens([0]) | masks.sliding_window(2)
    extra_bias = bias.alibi(4)
    q, k, v = _qkv(q_len=length, kv_len=length)
    whole = dense_attention(q, k, v, mask=extra_mask & masks.causal(), bias=extra_bias)[:, :, q_off:]
    model_mask = make_mask_function(extra_mask)(batch_size=2, q_length=q_len, kv_length=kv_len, q_offset=q_off,
                                                kv_offset=kv_off, mask_function=hf_masks.causal_mask_function)
    out, _ = make_attention_function(extra_mask, extra_bias)(
        _Module(), q[:, :, q_off:], k[:, :, kv_off:], v[:, :, kv_off:], model_mask)
    torch.testing.assert_close(out, whole.transpose(1, 2), rtol=0, atol=1e-12)


def test_weights_only_when_the_model_collects_them(calls):
    _, ours = twins(GPT2LMHeadModel, gpt2())  # GPT-2 does not pass output_attentions to the function
    with torch.no_grad():
        assert ours(tokens()).attentions is None
        assert calls and not any(wanted for _, wanted in calls)
        calls.clear()
        assert len(ours(tokens(), output_attentions=True).attentions) == 2
        assert calls and all(wanted for _, wanted in calls)


def test_a_sliding_window_model_stays_banded_in_prefill_and_decoding(calls):
    _, ours = twins(MistralForCausalLM, mistral(window=8))
    ours.generate(tokens(length=40), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert calls
    for mask, _ in calls:
        assert not torch.is_tensor(mask)
        assert mask is None or mask.band(1, 1) is not None
    prefill = calls[0][0]
    assert prefill.band(40, 40) == (-7, 0)


def test_a_users_4d_mask_with_a_registered_mask():
    q, k, v = _qkv()
    allowed = torch.ones(2, 1, 3, 5, dtype=torch.bool)
    allowed[1, ..., :2] = False
    out, _ = make_attention_function(masks.sliding_window(1))(_Module(), q, k, v, allowed)
    expected = dense_attention(q, k, v, mask=masks.TensorMask(allowed) & masks.sliding_window(1))
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=0, atol=1e-12)
    with pytest.raises(attnkit.UnsupportedFeature, match="additive float mask"):
        make_attention_function(masks.sliding_window(1))(_Module(), q, k, v, torch.randn(2, 1, 3, 5))


@pytest.mark.parametrize("keyword", ["indices", "block_indices"])
def test_sparse_indices_are_refused(keyword):
    q, k, v = _qkv()
    with pytest.raises(attnkit.UnsupportedFeature, match=keyword):
        make_attention_function()(_Module(), q, k, v, None, **{keyword: torch.zeros(2, dtype=torch.long)})


def test_registered_names_refuse_encoder_decoders():
    from transformers import BartConfig, BartForConditionalGeneration

    from attnkit.integrations.transformers import register

    config = BartConfig(vocab_size=97, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64)
    _, ours = twins(BartForConditionalGeneration, config, register("attnkit-test-window3", mask=masks.causal()))
    with pytest.raises(attnkit.UnsupportedFeature, match="encoder-decoder"):
        ours(tokens(), decoder_input_ids=tokens(length=4))
