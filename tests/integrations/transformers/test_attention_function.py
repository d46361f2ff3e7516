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


def test_per_token_sinks_as_eager_appends_them_against_the_oracle():
    q, k, v = _qkv()
    sinks = torch.randn(2, 4, 3, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(2))  # (B, H, Lq, 1)
    out, weights = make_attention_function()(_Module(), q, k, v, None, scaling=0.3, output_attentions=True,
                                             sinks=sinks)
    expected = dense_attention(q, k, v, mask=masks.causal(), scale=0.3, sinks=sinks[..., 0], return_weights=True)
    torch.testing.assert_close(out, expected.output.transpose(1, 2), rtol=0, atol=1e-12)
    torch.testing.assert_close(weights, expected.weights, rtol=0, atol=1e-12)
    assert (weights.sum(-1) < 1).all()


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


def test_registered_names_refuse_encoder_decoders():
    from transformers import BartConfig, BartForConditionalGeneration

    from attnkit.integrations.transformers import register

    config = BartConfig(vocab_size=97, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64)
    _, ours = twins(BartForConditionalGeneration, config, register("attnkit-test-window3", mask=masks.causal()))
    with pytest.raises(attnkit.UnsupportedFeature, match="encoder-decoder"):
        ours(tokens(), decoder_input_ids=tokens(length=4))


def _bert_generation(**options):
    from transformers import BertGenerationConfig, BertGenerationDecoder

    config = BertGenerationConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=48, max_position_embeddings=64, **options)
    eager, ours = twins(BertGenerationDecoder, config)
    with torch.no_grad():  # larger weights than the initial ones, so that greedy tokens vary
        for p in eager.parameters():
            p.normal_(0, 0.3)
    ours.load_state_dict(eager.state_dict())
    return eager, ours


def test_bert_generation_without_is_decoder_generates_as_eager():
    """Without ``is_decoder`` the layers are bidirectional yet fill the cache ``generate`` hands them, and the mask
    function, given no padding, builds a mask for the new token only: eager (no mask) attends to every cached key,
    and so does attnkit (this was refused as "22 keys with a mask built for 1")."""
    eager, ours = _bert_generation()
    prefix = torch.randint(3, 60, (2, 9), generator=torch.Generator().manual_seed(4))
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    want, got = eager.generate(prefix, **kwargs), ours.generate(prefix, **kwargs)
    assert torch.equal(got.sequences, want.sequences)
    torch.testing.assert_close(torch.stack(got.logits), torch.stack(want.logits), rtol=0, atol=1e-5)
    assert (want.logits[-1] - want.logits[1]).abs().max() > 1e-2  # each step reads the cache it grew


def test_bert_generation_decoder_with_cross_attention_decodes_as_eager():
    """The decoder (``is_decoder``) with cross-attention to padded encoder states: prefill and cached steps."""
    from transformers import DynamicCache, EncoderDecoderCache

    eager, ours = _bert_generation(is_decoder=True, add_cross_attention=True)
    g = torch.Generator().manual_seed(5)
    ids, states = torch.randint(3, 60, (2, 8), generator=g), torch.randn(2, 9, 32, generator=g)
    memory = dict(encoder_hidden_states=states, encoder_attention_mask=torch.tensor([[1] * 9, [1] * 6 + [0] * 3]))
    outs = []
    for model in (eager, ours):
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        with torch.no_grad():
            steps = [model(ids[:, :5], past_key_values=cache, use_cache=True, **memory).logits]
            steps += [model(ids[:, t:t + 1], past_key_values=cache, use_cache=True, **memory).logits for t in (5, 6, 7)]
            outs.append((model(ids, **memory).logits, torch.cat(steps, 1)))
    (full, cached), (want_full, want_cached) = outs[1], outs[0]
    torch.testing.assert_close(full, want_full, rtol=0, atol=1e-5)
    torch.testing.assert_close(cached, want_cached, rtol=0, atol=1e-5)
    assert torch.equal(cached.argmax(-1), want_cached.argmax(-1))


def test_keys_past_a_causal_mask_are_still_refused():
    mask = attention_function.ModelMask(masks.causal(), 0, 0, 1, shape=(2, 1, 1), dtype=torch.float32,
                                        device="cpu")
    q, _, _ = _qkv(q_len=1, kv_len=3)
    with pytest.raises(attnkit.UnsupportedFeature, match=r"attends to 3 keys with a mask built for 1"):
        attention_function.model_mask_of(mask, _Module(), None, q, 3, None)
