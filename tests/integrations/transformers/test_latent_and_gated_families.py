"""DeepSeek-V3 (latent attention), DiffLlama (differential) and Qwen3-Next (gated) on "attnkit" equal eager.

Each family passes attnkit something the older ones did not: DeepSeek-V3 keys of
``qk_nope_head_dim + qk_rope_head_dim`` features with values of ``v_head_dim`` (Dv != D) and a
YaRN-scaled softmax scale; DiffLlama two calls per layer over half-values; Qwen3-Next QK-norm,
partial rotary positions and a gate around the call, beside linear-attention layers that do not
call it. Logits agree to 1e-5 (with left padding) and greedy generation token for token.
"""

import pytest
import torch
import transformers as hf

from .helpers import VOCAB, assert_same_outputs, left_padded, tokens, twins

SMALL = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
FAMILIES = {
    "deepseek_v3 (yarn)": (hf.DeepseekV3Config, hf.DeepseekV3ForCausalLM, dict(
        SMALL, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=6,
        v_head_dim=5, n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, moe_intermediate_size=16,
        first_k_dense_replace=1, max_position_embeddings=64,
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
                         "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 10000.0})),
    "diffllama": (hf.DiffLlamaConfig, hf.DiffLlamaForCausalLM, dict(SMALL, num_key_value_heads=2)),
    "qwen3_next": (hf.Qwen3NextConfig, hf.Qwen3NextForCausalLM, dict(
        SMALL, num_key_value_heads=2, head_dim=8, layer_types=["linear_attention", "full_attention"],
        num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_and_greedy_generation_equal_eager(family):
    config_class, model_class, kwargs = FAMILIES[family]
    eager, ours = twins(model_class, config_class(**kwargs))
    assert_same_outputs(eager, ours, input_ids=tokens(), attention_mask=left_padded())
    gen = dict(attention_mask=left_padded(), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(tokens(), **gen), eager.generate(tokens(), **gen))
