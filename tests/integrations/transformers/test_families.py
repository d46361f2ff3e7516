"""More model families on "attnkit": outputs and weights equal eager's; what attnkit refuses, it names.

Tiny seeded random configs (no downloads). Each family exercises a convention: ALiBi-free
rotary decoders with grouped heads (Qwen2/3, Phi-3, Mixtral), parallel blocks (GPT-NeoX,
Falcon), alternating local/global layers (Gemma-3, Cohere-2, ModernBERT), chunked attention
(Llama-4: a pattern attnkit does not recognise, taken exactly as a dense mask), DeepSeek-V3's
latent attention, DiffLlama's differential and Qwen3-Next's gated layers, encoders
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
    # latent attention: keys of qk_nope + qk_rope features, values of v_head_dim; a YaRN-scaled softmax scale
    "deepseek_v3 (yarn)": (hf.DeepseekV3Config, hf.DeepseekV3ForCausalLM, dict(
        SMALL, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=6,
        v_head_dim=5, n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, moe_intermediate_size=16,
        first_k_dense_replace=1, max_position_embeddings=64,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                         "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0})),
    "diffllama (two calls a layer)": (hf.DiffLlamaConfig, hf.DiffLlamaForCausalLM, GQA),
    # QK-norm, partial rotary positions and a gate around the call, beside linear-attention layers
    "qwen3_next": (hf.Qwen3NextConfig, hf.Qwen3NextForCausalLM, dict(
        GQA, head_dim=8, layer_types=["linear_attention", "full_attention"], num_experts=2, num_experts_per_tok=1,
        moe_intermediate_size=16, shared_expert_intermediate_size=16, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)),
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


def test_deepseek_v4_compressed_keys_with_their_block_bias_equal_eager():
    """Both compressors emit entries (a window of 4 tokens each) and the indexer keeps 2 of them per query, so the
    layers' block_bias (per-query causality of the entries, the indexer's choice) decides what each query sees."""
    from .families import tiny_config

    config = tiny_config("deepseek_v4")
    config.compress_rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 4}
    config.index_topk = 2
    assert {"compressed_sparse_attention", "heavily_compressed_attention"} <= set(config.layer_types)
    eager, ours = twins(hf.DeepseekV4ForCausalLM, config)
    g = torch.Generator().manual_seed(4)
    for a, b in zip(eager.model.layers, ours.model.layers, strict=True):  # sinks that matter
        with torch.no_grad():
            a.self_attn.sinks.copy_(2 * torch.randn(a.self_attn.sinks.shape, generator=g))
            b.self_attn.sinks.copy_(a.self_attn.sinks)
    ids, keep = tokens(length=20), left_padded(length=20, pad=3)
    assert_same_outputs(eager, ours, input_ids=ids, attention_mask=keep)
    gen = dict(attention_mask=keep, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(ids, **gen), eager.generate(ids, **gen))
