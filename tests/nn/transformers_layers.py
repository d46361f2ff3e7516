"""Tiny random transformers linear-attention layers (Qwen3-Next, Kimi Linear, Mamba-2) and their decoding loop."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import DynamicCache  # noqa: E402
from transformers.models.kimi_linear import modeling_kimi_linear as kimi  # noqa: E402
from transformers.models.mamba2 import modeling_mamba2 as mamba2  # noqa: E402
from transformers.models.qwen3_next import modeling_qwen3_next as qwen  # noqa: E402


def _randomise(layer):
    with torch.no_grad():  # transformers' initial values (ones, zeros) would hide swapped parameters
        for p in layer.parameters():
            p.normal_(0, 0.3)
    return layer.eval()


def qwen3_next_layer(seed=0):
    config = transformers.Qwen3NextConfig(
        hidden_size=24, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=6,
        linear_value_head_dim=5, linear_conv_kernel_dim=4, num_hidden_layers=1, layer_types=["linear_attention"],
        num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    torch.manual_seed(seed)
    return _randomise(qwen.Qwen3NextGatedDeltaNet(config, 0)), config


def kimi_linear_layer(seed=0):
    config = transformers.KimiLinearConfig(
        hidden_size=24, linear_num_heads=3, linear_head_dim=5, linear_conv_kernel_dim=4, num_hidden_layers=1,
        layer_types=["linear_attention"], num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(seed)
    return _randomise(kimi.KimiLinearDeltaAttention(config, 0)), config


def mamba2_layer(seed=0):
    config = transformers.Mamba2Config(hidden_size=16, num_heads=4, head_dim=8, state_size=5, n_groups=2, expand=2,
                                       conv_kernel=4, chunk_size=8, num_hidden_layers=1)
    torch.manual_seed(seed)
    return _randomise(mamba2.Mamba2Mixer(config, 0)), config


def decode(layer, config, x, prefill: int):
    """transformers' layer over ``x[:, :prefill]`` with its cache, then one token at a time: ``(B, n, dim)``."""
    cache = DynamicCache(config=config)
    with torch.no_grad():
        outs = [layer(x[:, :prefill], cache=cache)]
        outs += [layer(x[:, t : t + 1], cache=cache) for t in range(prefill, x.shape[1])]
    return torch.cat(outs, 1)


def assert_reproduces(mine, theirs, config, dim: int) -> None:
    """``mine`` equals transformers' ``theirs`` (float32, 1e-5) in prefill and in cached decoding after 6 tokens."""
    x = torch.randn(2, 11, dim, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(mine(x), theirs(x), rtol=1e-5, atol=1e-5)
        cache = mine.new_cache()
        steps = [mine(x[:, :6], cache=cache)] + [mine.forward_step(x[:, t], cache)[:, None] for t in range(6, 11)]
    torch.testing.assert_close(torch.cat(steps, 1), decode(theirs, config, x, 6), rtol=1e-5, atol=1e-5)


def _mixer(module, cls_name, config_cls, layer_idx=0, **options):
    config = getattr(transformers, config_cls)(**options)
    torch.manual_seed(0)
    return _randomise(getattr(module, cls_name)(config, layer_idx)), config


def mamba2_family_layer(family: str):
    """A tiny random Mamba-2 mixer of ``family`` (its first layer a Mamba layer), shaped like its checkpoints: the
    families' head and group layouts, biases and norms, at 16 model features. ``(layer, config)``."""
    from transformers.models.bamba import modeling_bamba
    from transformers.models.falcon_h1 import modeling_falcon_h1
    from transformers.models.granitemoehybrid import modeling_granitemoehybrid
    from transformers.models.nemotron_h import modeling_nemotron_h
    from transformers.models.zamba2 import modeling_zamba2

    common = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
    if family == "mamba2":  # Mamba-Codestral: 8 groups; here 2 groups of 2 heads, biases on the projections
        return _mixer(mamba2, "Mamba2Mixer", "Mamba2Config", hidden_size=16, num_heads=4, head_dim=8, state_size=5,
                      n_groups=2, expand=2, conv_kernel=4, chunk_size=8, num_hidden_layers=1, use_bias=True)
    if family == "bamba":  # Bamba-9B: one group, no projection bias
        return _mixer(modeling_bamba, "BambaMixer", "BambaConfig", **common, attn_layer_indices=[1],
                      mamba_n_heads=4, mamba_d_head=8, mamba_d_state=5, mamba_n_groups=1, mamba_expand=2,
                      mamba_d_conv=4, mamba_chunk_size=8)
    if family == "nemotron_h":  # heads x head_dim is d_inner (not expand x dim); dt >= time_step_min
        return _mixer(modeling_nemotron_h, "NemotronHMamba2Mixer", "NemotronHConfig", **common,
                      layers_block_type=["mamba", "attention"], mamba_num_heads=4, mamba_head_dim=6,
                      ssm_state_size=5, n_groups=2, conv_kernel=4, chunk_size=8, time_step_min=0.05)
    if family.startswith("falcon_h1"):  # mamba_d_ssm; multipliers on the input and on in_proj's outputs
        norm = family != "falcon_h1 (no norm)"
        layer, config = _mixer(
            modeling_falcon_h1, "FalconH1Mixer", "FalconH1Config", **common, mamba_n_heads=4, mamba_d_head=6,
            mamba_d_ssm=24, mamba_d_state=5, mamba_n_groups=2, mamba_d_conv=4, mamba_chunk_size=8,
            mamba_rms_norm=norm, mamba_norm_before_gate=family == "falcon_h1 (norm before gate)",
            mamba_proj_bias=True, projectors_bias=True, ssm_in_multiplier=0.7,
            ssm_multipliers=[1.3, 0.6, 0.9, 1.1, 0.8])
        layer.register_buffer("mup_vector", modeling_falcon_h1.compute_mup_vector(config))  # as the model sets it
        return layer, config
    if family == "granitemoehybrid":  # Granite-4.0-H: one group
        return _mixer(modeling_granitemoehybrid, "GraniteMoeHybridMambaLayer", "GraniteMoeHybridConfig", **common,
                      layer_types=["mamba", "attention"], mamba_n_heads=4, mamba_d_head=8, mamba_d_state=5,
                      mamba_n_groups=1, mamba_expand=2, mamba_d_conv=4, mamba_chunk_size=8)
    if family == "zamba2":  # Zamba2: dt >= time_step_min, the norm's eps fixed at 1e-5
        return _mixer(modeling_zamba2, "Zamba2MambaMixer", "Zamba2Config", **common, n_mamba_heads=4,
                      layers_block_type=["linear_attention", "hybrid"],
                      mamba_headdim=8, mamba_d_state=5, mamba_ngroups=2, mamba_expand=2, mamba_d_conv=4,
                      chunk_size=8, add_bias_linear=True, time_step_min=0.05)
    raise KeyError(family)


MAMBA2_FAMILIES = ("mamba2", "bamba", "nemotron_h", "falcon_h1", "falcon_h1 (no norm)", "falcon_h1 (norm before gate)",
                   "granitemoehybrid", "zamba2")


def minimax_lightning_layer(layer_idx=1, seed=0):
    """A tiny random ``MiniMaxLightningAttention`` (4 heads of 6, blocks of 4) at depth ``layer_idx`` of 3 layers,
    shaped as MiniMax-Text-01 (64 heads of 128 over 6144, blocks of 256): heads x head_dim over the model width."""
    from transformers.models.minimax import modeling_minimax

    config = transformers.MiniMaxConfig(hidden_size=16, num_attention_heads=4, head_dim=6, num_key_value_heads=2,
                                        num_hidden_layers=3, block_size=4, intermediate_size=32, num_local_experts=2,
                                        layer_types=["linear_attention"] * 2 + ["full_attention"])
    torch.manual_seed(seed)
    return _randomise(modeling_minimax.MiniMaxLightningAttention(config, layer_idx)), config


def rwkv_layer(seed=0):
    """A tiny random RWKV-4 ``RwkvSelfAttention`` (the second of two layers), its WKV 12 channels wide over a model
    width of 16 (``attention_hidden_size``), decays spread as trained checkpoints' (``time_decay`` in [-5, 8])."""
    from transformers.models.rwkv import modeling_rwkv

    config = transformers.RwkvConfig(hidden_size=16, attention_hidden_size=12, num_hidden_layers=2, context_length=64)
    torch.manual_seed(seed)
    layer = _randomise(modeling_rwkv.RwkvSelfAttention(config, 1))
    with torch.no_grad():
        layer.time_decay.copy_(torch.linspace(-5, 8, 12))
        layer.time_first.copy_(torch.linspace(-1, 3, 12))
    return layer, config
