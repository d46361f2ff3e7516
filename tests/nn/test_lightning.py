"""LightningAttention: MiniMax's lightning attention, equal to transformers' layer and to a float64 transcription."""

import pytest
import torch

from attnkit.errors import ArgumentError, DTypeError
from attnkit.nn import LightningAttention
from attnkit.nn.lightning import lightning_slopes
from attnkit.registry import get

from .transformers_layers import minimax_lightning_layer


def _theirs(layer, x, cache=None):
    return layer(x, position_embeddings=None, attention_mask=None, cache=cache)[0]


def _transcription(layer: LightningAttention, x):
    """Float64, token by token: S_t = exp(-s) S_{t-1} + k_t^T v_t, o_t = q_t S_t; RMS norm, sigmoid gate, out."""
    x = x.double()
    w = {k: v.double() for k, v in layer.state_dict().items()}
    heads, d = layer.num_heads, layer.core_sizes[1]
    qkv = torch.nn.functional.silu(x @ w["qkv_proj.weight"].T).unflatten(-1, (heads, 3, d))
    q, k, v = qkv[..., 0, :], qkv[..., 1, :], qkv[..., 2, :]  # (B, n, H, d)
    decay = w["log_decay"].exp()[:, None, None]
    state = x.new_zeros(x.shape[0], heads, d, d)
    outs = []
    for t in range(x.shape[1]):
        state = decay * state + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhd,bhde->bhe", q[:, t], state).flatten(1))
    o = torch.stack(outs, 1)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + layer.norm.eps) * w["norm.weight"]
    return (o * torch.sigmoid(x @ w["output_gate.weight"].T)) @ w["out_proj.weight"].T


@pytest.mark.parametrize("layer_idx", [0, 1])
def test_from_transformers_reproduces_prefill_and_cached_decoding(layer_idx):
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    theirs, _ = minimax_lightning_layer(layer_idx)
    mine = LightningAttention.from_transformers(theirs)
    assert torch.allclose(mine.log_decay, -lightning_slopes(4, layer_idx, 3).float(), rtol=1e-6)
    x = torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(1))  # 11 tokens: blocks of 4, the last cut
    with torch.no_grad():
        want = _theirs(theirs, x)
        for form in ("chunk", "recurrent", "parallel"):
            torch.testing.assert_close(mine(x, form=form), want, rtol=1e-5, atol=1e-5)
        cache = MiniMaxCache()
        steps = [_theirs(theirs, x[:, :6], cache)] + [_theirs(theirs, x[:, t:t + 1], cache) for t in range(6, 11)]
        ours = mine.new_cache()
        mine_steps = [mine(x[:, :6], cache=ours)] + [mine.forward_step(x[:, t], ours)[:, None] for t in range(6, 11)]
    torch.testing.assert_close(torch.cat(mine_steps, 1), torch.cat(steps, 1), rtol=1e-5, atol=1e-5)


def test_equals_a_float64_transcription_in_every_form():
    torch.manual_seed(0)
    layer = LightningAttention(12, 3, head_dim=5, layer_index=1, num_layers=4, chunk_size=4).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    x = torch.randn(2, 13, 12, dtype=torch.float64)
    want = _transcription(layer, x)
    for form in ("chunk", "recurrent", "parallel"):
        torch.testing.assert_close(layer(x, form=form), want, rtol=0, atol=1e-10)


def test_bad_arguments_and_layers_are_named():
    with pytest.raises(DTypeError, match="takes a MiniMaxLightningAttention; got Linear"):
        LightningAttention.from_transformers(torch.nn.Linear(2, 2))
    with pytest.raises(ArgumentError, match="layer_index must be in"):
        LightningAttention(16, 2, layer_index=3, num_layers=3)


def test_registry_entry_runs_its_example():
    module, inputs = get("lightning-attention").example()
    assert isinstance(module, LightningAttention) and module(*inputs).shape == inputs[0].shape
