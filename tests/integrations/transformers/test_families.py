"""More model families on "attnkit": outputs and weights equal eager's; what attnkit refuses, it names.

Tiny seeded random configs (no downloads). Each family exercises a convention: ALiBi-free
rotary decoders with grouped heads (Qwen2/3, Phi-3, Mixtral), parallel blocks (GPT-NeoX,
Falcon), alternating local/global layers (Gemma-3, Cohere-2, ModernBERT), chunked attention
(Llama-4: a pattern attnkit does not recognise, taken exactly as a dense mask), encoders
(RoBERTa, DistilBERT, ViT), encoder-decoders with cross-attention (BART, Whisper) and T5's
position bias; gpt-oss's learned attention sinks, on its sliding and full layers.
"""

import pytest
import torch
import transformers as hf

from .helpers import VOCAB, assert_same_outputs, left_padded, right_padded, tokens, twins

SMALL = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
GQA = dict(SMALL, num_key_value_heads=2)
SEQ2SEQ = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
               decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, pad_token_id=0,
               decoder_start_token_id=1, bos_token_id=1, eos_token_id=2)

DECODERS = {
    "qwen2": (hf.Qwen2Config, hf.Qwen2ForCausalLM, GQA),
    "qwen3": (hf.Qwen3Config, hf.Qwen3ForCausalLM, dict(GQA, head_dim=8)),
    "phi3": (hf.Phi3Config, hf.Phi3ForCausalLM, dict(GQA, pad_token_id=0)),
    "mixtral": (hf.MixtralConfig, hf.MixtralForCausalLM,
                dict(GQA, num_local_experts=2, num_experts_per_tok=1, sliding_window=4)),
    "gpt_neox": (hf.GPTNeoXConfig, hf.GPTNeoXForCausalLM, SMALL),
    "falcon": (hf.FalconConfig, hf.FalconForCausalLM,
               dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)),
    "gemma3": (hf.Gemma3TextConfig, hf.Gemma3ForCausalLM, dict(GQA, head_dim=8, sliding_window=4)),
    "cohere2": (hf.Cohere2Config, hf.Cohere2ForCausalLM, dict(GQA, sliding_window=4)),
    "llama4 (chunked)": (hf.Llama4TextConfig, hf.Llama4ForCausalLM,
                         dict(GQA, head_dim=8, attention_chunk_size=4, num_local_experts=2,
                              intermediate_size_mlp=64)),
}


@pytest.mark.parametrize("family", list(DECODERS))
def test_decoders_with_left_padding_and_generation(family):
    config_class, model_class, kwargs = DECODERS[family]
    eager, ours = twins(model_class, config_class(**kwargs))
    assert_same_outputs(eager, ours, input_ids=tokens(), attention_mask=left_padded())
    gen = dict(attention_mask=left_padded(), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(tokens(), **gen), eager.generate(tokens(), **gen))


@pytest.mark.parametrize("family", ["roberta", "distilbert", "modernbert"])
def test_encoders_with_right_padding(family):
    config, model_class = {
        "roberta": (hf.RobertaConfig(**SMALL), hf.RobertaModel),
        "distilbert": (hf.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, hidden_dim=64),
                       hf.DistilBertModel),
        "modernbert": (hf.ModernBertConfig(**SMALL, local_attention=4, pad_token_id=0), hf.ModernBertModel),
    }[family]
    eager, ours = twins(model_class, config)
    assert_same_outputs(eager, ours, input_ids=tokens(), attention_mask=right_padded())


def test_vit_without_a_mask():
    config = hf.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                          image_size=16, patch_size=4)
    eager, ours = twins(hf.ViTModel, config)
    assert_same_outputs(eager, ours, pixel_values=torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_encoder_decoders_with_cross_attention(family):
    config, model_class = {
        "t5": (hf.T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                           decoder_start_token_id=0), hf.T5ForConditionalGeneration),
        "bart": (hf.BartConfig(**SEQ2SEQ), hf.BartForConditionalGeneration),
    }[family]
    eager, ours = twins(model_class, config)
    inputs = dict(input_ids=tokens(), attention_mask=right_padded(), decoder_input_ids=tokens(length=5, seed=2))
    with torch.no_grad():
        a, b = eager(**inputs, output_attentions=True), ours(**inputs, output_attentions=True)
    torch.testing.assert_close(b.logits, a.logits, rtol=0, atol=1e-5)
    for name in ("decoder_attentions", "cross_attentions"):
        for wa, wb in zip(getattr(a, name), getattr(b, name), strict=True):
            torch.testing.assert_close(wb, wa, rtol=0, atol=1e-5)
    gen = dict(attention_mask=right_padded(), max_new_tokens=5, do_sample=False)
    assert torch.equal(ours.generate(tokens(), **gen), eager.generate(tokens(), **gen))


def test_gpt_oss_with_learned_sinks_on_sliding_and_full_layers():
    config = hf.GptOssConfig(**GQA, head_dim=8, num_local_experts=2, num_experts_per_tok=1, sliding_window=4)
    assert set(config.layer_types) == {"sliding_attention", "full_attention"}
    eager, ours = twins(hf.GptOssForCausalLM, config)
    g = torch.Generator().manual_seed(3)
    for a, b in zip(eager.model.layers, ours.model.layers, strict=True):  # sinks that matter: N(0, 4), not ~0
        with torch.no_grad():
            a.self_attn.sinks.copy_(2 * torch.randn(a.self_attn.sinks.shape, generator=g))
            b.self_attn.sinks.copy_(a.self_attn.sinks)
    assert_same_outputs(eager, ours, input_ids=tokens(), attention_mask=left_padded())
    gen = dict(attention_mask=left_padded(), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(tokens(), **gen), eager.generate(tokens(), **gen))
