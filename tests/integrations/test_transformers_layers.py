"""from_transformers: attnkit modules built from transformers attention layers reproduce them (float32, 1e-5).

Each layer is a tiny random one (every parameter drawn, so zero-initialised norms and biases
count), called as its model calls it: the model's rotary table at positions ``0 ..``, a causal
float mask, eager attention.
"""

from __future__ import annotations

import math

import pytest
import torch
import transformers as hf
from transformers.models.llama import modeling_llama
from transformers.models.qwen3 import modeling_qwen3
from transformers.models.qwen3_next import modeling_qwen3_next

from attnkit.errors import ArgumentError
from attnkit.nn.differential import DifferentialAttention
from attnkit.nn.latent import MultiHeadLatentAttention
from attnkit.nn.multihead import MultiHeadAttention

B, N = 2, 11


def _randomise(layer, std=0.3):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, std)
    return layer.eval()


def _run(layer, rotary, x):
    """The layer's output on ``x`` at positions 0 .. N-1 with a causal mask, as its model calls it."""
    positions = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
    mask = torch.full((x.shape[1],) * 2, float("-inf")).triu(1)[None, None].expand(x.shape[0], 1, -1, -1)
    with torch.no_grad():
        return layer(x, position_embeddings=rotary(x, positions), attention_mask=mask)[0]


def _x(dim, seed=1):
    return torch.randn(B, N, dim, generator=torch.Generator().manual_seed(seed))


GQA = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=32)
MULTIHEAD = {
    "qwen3-next (gate, QK-norm, partial RoPE, YaRN)": (
        modeling_qwen3_next, "Qwen3Next", hf.Qwen3NextConfig(**GQA, attention_bias=True, rope_parameters={
            "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "rope_theta": 500.0,
            "partial_rotary_factor": 0.5})),
    "qwen3 (QK-norm)": (modeling_qwen3, "Qwen3", hf.Qwen3Config(**GQA, rope_parameters={"rope_type": "default",
                                                                                        "rope_theta": 300.0})),
    "llama (llama3 scaling)": (modeling_llama, "Llama", hf.LlamaConfig(**GQA, attention_bias=True, rope_parameters={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8, "rope_theta": 100.0})),
}


@pytest.mark.parametrize("family", list(MULTIHEAD))
def test_multihead_from_transformers_reproduces_the_layer(family):
    module, prefix, config = MULTIHEAD[family]
    config._attn_implementation = "eager"
    layer = _randomise(getattr(module, f"{prefix}Attention")(config, 0))
    x = _x(config.hidden_size)
    want = _run(layer, getattr(module, f"{prefix}RotaryEmbedding")(config), x)
    ours = MultiHeadAttention.from_transformers(layer)
    got, _ = ours(x, x, x, is_causal=True, need_weights=False)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert (ours.gate is not None, ours.qk_norm is not None) == (prefix == "Qwen3Next", prefix != "Llama")


def test_multihead_from_transformers_refuses_what_it_cannot_reproduce():
    wide = hf.LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    with pytest.raises(ArgumentError, match=r"num_attention_heads \* head_dim = 4 \* 16 = 64; got hidden_size=32"):
        MultiHeadAttention.from_transformers(modeling_llama.LlamaAttention(wide, 0))
    layer = modeling_llama.LlamaAttention(hf.LlamaConfig(hidden_size=32, num_attention_heads=4), 0)
    layer.scaling = 0.5
    with pytest.raises(ArgumentError, match=r"scales scores by 0\.5"):
        MultiHeadAttention.from_transformers(layer)


DEEPSEEK = dict(hidden_size=24, num_attention_heads=3, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=6,
                v_head_dim=5, max_position_embeddings=32, num_key_value_heads=3)


@pytest.mark.parametrize(("q_lora_rank", "interleave", "rope"), [
    (12, True, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "rope_theta": 200.0,
                "mscale": 0.8, "mscale_all_dim": 0.9, "beta_fast": 8.0, "beta_slow": 1.0}),
    (None, False, {"rope_type": "default", "rope_theta": 300.0}),
    (12, True, {"rope_type": "default", "rope_theta": 300.0})])
@pytest.mark.parametrize("form", ["naive", "absorbed"])
def test_latent_from_transformers_reproduces_deepseek_v3(q_lora_rank, interleave, rope, form):
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    config = hf.DeepseekV3Config(**DEEPSEEK, q_lora_rank=q_lora_rank, rope_interleave=interleave, attention_bias=True,
                                 rope_parameters=rope)
    config._attn_implementation = "eager"
    layer = _randomise(ds.DeepseekV3Attention(config, 0))
    x = _x(config.hidden_size)
    want = _run(layer, ds.DeepseekV3RotaryEmbedding(config), x)
    ours = MultiHeadLatentAttention.from_transformers(layer)
    torch.testing.assert_close(ours(x, form=form), want, rtol=0, atol=1e-5)
    assert ours.scale == layer.scaling and (rope["rope_type"] == "default") == (layer.scaling == 10 ** -0.5)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_differential_from_transformers_reproduces_diffllama(kv_heads):
    from transformers.models.diffllama import modeling_diffllama as dl

    config = hf.DiffLlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=kv_heads,
                                max_position_embeddings=32, rms_norm_eps=1e-5,
                                rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 100.0})
    config._attn_implementation = "eager"
    layer = _randomise(dl.DiffLlamaAttention(config, 3))
    x = _x(config.hidden_size)
    want = _run(layer, dl.DiffLlamaRotaryEmbedding(config), x)
    ours = DifferentialAttention.from_transformers(layer)
    torch.testing.assert_close(ours(x), want, rtol=0, atol=1e-5)
    assert ours.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.9)) and ours.num_heads == 2
