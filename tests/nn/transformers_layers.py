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
