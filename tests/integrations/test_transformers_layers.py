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


def _mask(queries, keys, window=None):
    """transformers' float mask: query at position ``q`` sees key ``k <= q`` (and ``k > q - window``)."""
    q, k = queries[:, None], keys[None, :]
    allowed = (k <= q) & (True if window is None else k > q - window)
    return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))[None, None]


def _run(layer, rotary, x, window=None):
    """The layer's output on ``x`` at positions 0 .. N-1 with its model's mask."""
    positions = torch.arange(x.shape[1])
    mask = _mask(positions, positions, window).expand(x.shape[0], 1, -1, -1)
    with torch.no_grad():
        return layer(x, position_embeddings=rotary(x, positions[None].expand(x.shape[0], -1)), attention_mask=mask)[0]


def _run_cached(layer, rotary, x, prefill, window=None):
    """The layer over ``x[:, :prefill]`` with a cache, then one token at a time: ``(B, N, dim)``."""
    cache, outs = hf.DynamicCache(), []
    with torch.no_grad():
        for lo, hi in [(0, prefill)] + [(t, t + 1) for t in range(prefill, x.shape[1])]:
            positions = torch.arange(lo, hi)
            mask = _mask(positions, torch.arange(hi), window).expand(x.shape[0], 1, -1, -1)
            outs.append(layer(x[:, lo:hi], position_embeddings=rotary(x, positions[None].expand(x.shape[0], -1)),
                              attention_mask=mask, cache=cache)[0])
    return torch.cat(outs, 1)


def _x(dim, seed=1):
    return torch.randn(B, N, dim, generator=torch.Generator().manual_seed(seed))


# Layouts as the released checkpoints have them: heads that do not fill the model width (Qwen3-0.6B: 16 heads
# x 128 over 1024; Qwen3-Next-80B: 16 x 256 over 2048; Gemma-7B: 16 x 256 over 3072; Mistral-Nemo: 32 x 128
# over 5120), Qwen2's q/k/v biases without an output bias, sliding windows.
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "rope_theta": 500.0}
MULTIHEAD = {
    "qwen3-next (gate, QK-norm, partial RoPE, YaRN, 4 x 8 over 24)": (
        "qwen3_next", "Qwen3Next", dict(hidden_size=24, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                         attention_bias=True, rope_parameters={**YARN, "partial_rotary_factor": 0.5})),
    "qwen3 (QK-norm, 4 x 16 over 24)": (
        "qwen3", "Qwen3", dict(hidden_size=24, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                               rope_parameters={"rope_type": "default", "rope_theta": 300.0})),
    "qwen2 (q/k/v biases, sliding window 4)": (
        "qwen2", "Qwen2", dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True,
                               sliding_window=4, max_window_layers=0)),
    "llama (llama3 scaling, biases)": (
        "llama", "Llama", dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                               attention_bias=True, rope_parameters={
                                   "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8,
                                   "rope_theta": 100.0})),
    "llama (proportional RoPE, a quarter of the pairs turn)": (
        "llama", "Llama", dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=24,
                               rope_parameters={"rope_type": "proportional", "rope_theta": 100.0, "factor": 2.0,
                                                "partial_rotary_factor": 0.25})),
    "mistral (sliding window 5, 4 x 16 over 40)": (
        "mistral", "Mistral", dict(hidden_size=40, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                   sliding_window=5)),
    "gemma (4 x 16 over 48)": (
        "gemma", "Gemma", dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=1, head_dim=16)),
    "gemma3 (QK-norm 1 + w, query_pre_attn_scalar, sliding window 3)": (
        "gemma3", "Gemma3Text", dict(hidden_size=40, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     query_pre_attn_scalar=12, sliding_window=3,
                                     layer_types=["sliding_attention", "full_attention"], num_hidden_layers=2)),
}


def _family_layer(family, layer_idx=0):
    """A random layer of ``family`` (its eager attention) and the rotary table its model calls it with."""
    import importlib

    name, prefix, options = MULTIHEAD[family]
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    config = getattr(hf, f"{prefix}Config")(**options, max_position_embeddings=32)
    config._attn_implementation = "eager"
    attention = getattr(module, f"{prefix.removesuffix('Text')}Attention")
    layer = _randomise(attention(config, layer_idx))
    table = getattr(module, f"{prefix.removesuffix('Text')}RotaryEmbedding")(config)
    layer_type = getattr(layer, "layer_type", None)
    rotary = (lambda x, p: table(x, p, layer_type)) if prefix == "Gemma3Text" else table
    window = layer.sliding_window if hasattr(layer, "sliding_window") else getattr(config, "sliding_window", None)
    return layer, rotary, config, window


@pytest.mark.parametrize("family", list(MULTIHEAD))
def test_multihead_from_transformers_reproduces_the_layer(family):
    layer, rotary, config, window = _family_layer(family)
    x = _x(config.hidden_size)
    ours = MultiHeadAttention.from_transformers(layer)
    got, _ = ours(x, x, x, is_causal=True, need_weights=False)
    torch.testing.assert_close(got, _run(layer, rotary, x, window), rtol=0, atol=1e-5)
    prefix = MULTIHEAD[family][1]
    assert (ours.gate is not None, ours.qk_norm is not None) == (prefix == "Qwen3Next", prefix in (
        "Qwen3Next", "Qwen3", "Gemma3Text"))
    assert ours.inner_dim == config.num_attention_heads * layer.head_dim
    assert (ours.extra_mask is None) == (window is None)


@pytest.mark.parametrize("family", list(MULTIHEAD))
def test_multihead_from_transformers_decodes_as_the_layer_with_its_cache(family):
    layer, rotary, config, window = _family_layer(family)
    x = _x(config.hidden_size, seed=2)
    ours = MultiHeadAttention.from_transformers(layer)
    cache = ours.new_cache(B, N)
    with torch.no_grad():
        steps = [ours.forward_step(x[:, :6], cache)[0]] + [ours.forward_step(x[:, t:t + 1], cache)[0]
                                                             for t in range(6, N)]
    torch.testing.assert_close(torch.cat(steps, 1), _run_cached(layer, rotary, x, 6, window), rtol=0, atol=1e-5)


def test_multihead_from_transformers_refuses_what_it_cannot_reproduce():
    from transformers.models.gemma2 import modeling_gemma2

    config = hf.Gemma2Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                             attn_logit_softcapping=50.0)
    with pytest.raises(ArgumentError, match=r"attn_logit_softcapping=50\.0"):
        MultiHeadAttention.from_transformers(modeling_gemma2.Gemma2Attention(config, 0))
    layer = modeling_llama.LlamaAttention(hf.LlamaConfig(hidden_size=32, num_attention_heads=4), 0)
    layer.k_proj = torch.nn.Identity()
    with pytest.raises(ArgumentError, match=r"k_proj is Identity"):
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


@pytest.mark.parametrize(("kv_heads", "head_dim"), [(4, None), (2, None), (2, 12)])
def test_differential_from_transformers_reproduces_diffllama(kv_heads, head_dim):
    from transformers.models.diffllama import modeling_diffllama as dl

    config = hf.DiffLlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=kv_heads, head_dim=head_dim,
                                max_position_embeddings=32, rms_norm_eps=1e-5,
                                rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 100.0})
    config._attn_implementation = "eager"
    layer = _randomise(dl.DiffLlamaAttention(config, 3))
    x = _x(config.hidden_size)
    want = _run(layer, dl.DiffLlamaRotaryEmbedding(config), x)
    ours = DifferentialAttention.from_transformers(layer)
    torch.testing.assert_close(ours(x), want, rtol=0, atol=1e-5)
    assert ours.lambda_init == pytest.approx(0.8 - 0.6 * math.exp(-0.9)) and ours.num_heads == 2


DSA = dict(hidden_size=24, num_attention_heads=3, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=6,
           v_head_dim=5, q_lora_rank=12, max_position_embeddings=32, num_key_value_heads=3, index_n_heads=8,
           index_head_dim=8, num_hidden_layers=1)
DSA_FAMILIES = {
    "deepseek_v32 (half-split indexer RoPE, YaRN)": ("deepseek_v32", "DeepseekV32", {"rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8, "rope_theta": 200.0,
        "mscale": 0.8, "mscale_all_dim": 0.9, "beta_fast": 8.0, "beta_slow": 1.0}}),
    "glm_moe_dsa (interleaved indexer RoPE)": ("glm_moe_dsa", "GlmMoeDsa", {
        "rope_parameters": {"rope_type": "default", "rope_theta": 300.0}, "indexer_types": ["full"]}),
}


def _dsa_layer(family, top_k):
    import importlib

    name, prefix, options = DSA_FAMILIES[family]
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    config = getattr(hf, f"{prefix}Config")(**DSA, **options, index_topk=top_k)
    config._attn_implementation = "eager"
    layer = _randomise(getattr(module, f"{prefix}Attention")(config, 0))
    return layer, getattr(module, f"{prefix}RotaryEmbedding")(config), config


def _dense_twin(dsa):
    """The :class:`MultiHeadLatentAttention` with ``dsa``'s weights and no indexer: every key."""
    dense = MultiHeadLatentAttention(24, 3, kv_lora_rank=8, q_lora_rank=12, qk_nope_head_dim=6, qk_rope_head_dim=4,
                                     v_head_dim=5, rotary=dsa.rotary)
    dense.load_state_dict({k: v for k, v in dsa.state_dict().items() if not k.startswith("indexer.")})
    dense.scale = dsa.scale
    return dense.eval()


def _dsa_run(layer, rotary, x):
    positions = torch.arange(x.shape[1])
    mask = _mask(positions, positions).expand(x.shape[0], 1, -1, -1)
    with torch.no_grad():
        return layer(x, position_embeddings=rotary(x, positions[None].expand(x.shape[0], -1)), attention_mask=mask,
                     position_ids=positions[None])[0]


@pytest.mark.parametrize("family", list(DSA_FAMILIES))
@pytest.mark.parametrize("form", ["naive", "absorbed"])
def test_dsa_latent_from_transformers_reproduces_the_layer_and_its_indexer(family, form):
    from attnkit.nn.dsa import DSALatentAttention

    layer, rotary, config = _dsa_layer(family, top_k=4)
    x = _x(config.hidden_size)
    ours = DSALatentAttention.from_transformers(layer)
    with torch.no_grad():
        # the indexer's scores are transformers' (the ones its top-k is taken from), with no tie at the k-th key
        c_q = layer.q_a_layernorm(layer.q_a_proj(x))
        positions = torch.arange(N)
        cos_sin = rotary(x, positions[None].expand(B, -1))
        picked = layer.indexer(x, c_q, cos_sin, _mask(positions, positions)[0].expand(B, -1, -1), positions[None])
        # the same keys from the query on which a query has more than k to choose from (before: all it sees)
        assert torch.equal(picked.long().sort(-1).values[:, 4:], ours.indexer(x, query=c_q).sort(-1).values[:, 4:])
        kth = ours.indexer.scores(x, query=c_q)[:, 4:].topk(5, dim=-1).values
        assert (kth[..., 3] - kth[..., 4]).abs().min() > 1e-6  # no near-tie at the k-th key: the selection is stable
    torch.testing.assert_close(ours(x, form=form), _dsa_run(layer, rotary, x), rtol=0, atol=1e-5)
    # the top-k matters: the same weights without the indexer differ
    assert (ours(x) - _dense_twin(ours)(x)).abs().max() > 1e-2


@pytest.mark.parametrize("family", list(DSA_FAMILIES))
def test_dsa_latent_choosing_every_key_is_dense_latent_attention(family):
    layer, rotary, config = _dsa_layer(family, top_k=64)
    x = _x(config.hidden_size)
    from attnkit.nn.dsa import DSALatentAttention

    ours = DSALatentAttention.from_transformers(layer)
    want = _dsa_run(layer, rotary, x)
    torch.testing.assert_close(ours(x), want, rtol=0, atol=1e-5)
    torch.testing.assert_close(_dense_twin(ours)(x), want, rtol=0, atol=1e-5)


def test_latent_from_transformers_refuses_a_layer_with_an_indexer():
    from attnkit.nn.dsa import DSALatentAttention

    layer = _dsa_layer("deepseek_v32 (half-split indexer RoPE, YaRN)", top_k=4)[0]
    with pytest.raises(ArgumentError, match=r"lightning indexer.*DSALatentAttention\.from_transformers"):
        MultiHeadLatentAttention.from_transformers(layer)
    from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as glm

    shared = hf.GlmMoeDsaConfig(**{**DSA, "num_hidden_layers": 2}, indexer_types=["full", "shared"])
    with pytest.raises(ArgumentError, match=r"lightning indexer"):
        MultiHeadLatentAttention.from_transformers(glm.GlmMoeDsaAttention(shared, 1))
    with pytest.raises(ArgumentError, match=r"reuses an earlier layer's top-k selection"):
        DSALatentAttention.from_transformers(glm.GlmMoeDsaAttention(shared, 1))
    with pytest.raises(ArgumentError, match=r"no decoding cache"):
        DSALatentAttention.from_transformers(layer)(_x(24), cache=object())
