"""Log-linear Mamba-2 and Gated DeltaNet layers against float64 transcriptions of their blocks (Guo et al. 2025,
arXiv:2506.04761, Sec. 3.2), and equal to their base layers while every level weight is 1."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnkit.distributed.recurrences import sequence_parallel
from attnkit.errors import UnsupportedFeature
from attnkit.nn import GatedDeltaNet, LogLinearGatedDeltaNet, LogLinearMamba2, Mamba2Mixer
from attnkit.registry import get

from ..functional.recurrences.test_log_linear import oracle
from .recurrent_reference import assert_same_gradients, causal_conv, heads, linear, merge, rms, unit

DIM = 12


def _perturbed(layer):
    torch.manual_seed(0)
    layer = layer.double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return layer


def _lambdas(layer, x, h):
    """lambda = softplus(x W_l + b_l), (B, n, H G) -> (B, H, n, G)."""
    return F.softplus(linear(x, layer.level_proj)).reshape(*x.shape[:2], h, -1).permute(0, 2, 1, 3)


def _mamba2(layer, x):
    """The Mamba-2 block (Dao & Gu 2024, Sec. 7) with log-linear weights, from the parameters."""
    inner, bc, groups = layer.sizes
    hh = layer.core_sizes[0]
    z, xbc, dt = linear(x, layer.in_proj).split([inner, inner + 2 * bc, hh], -1)
    xbc = causal_conv(xbc, layer.conv1d.weight, layer.conv1d.bias)
    xs, b, c = xbc.split([inner, bc, bc], -1)
    xs = heads(xs, hh)
    dt = F.softplus(dt + layer.dt_bias.double()).transpose(1, 2)  # (B, H, n)
    a = -layer.A_log.double().exp()
    per_head = lambda t: heads(t, groups).repeat_interleave(hh // groups, 1)
    out = oracle(per_head(c), per_head(b), xs * dt[..., None], dt * a[:, None], _lambdas(layer, x, hh))
    y = merge(out + xs * layer.D.double()[:, None, None])
    gated = (y * F.silu(z)).reshape(*y.shape[:2], groups, -1)
    return linear(rms(gated, 1e-5).flatten(2) * layer.norm.weight.double(), layer.out_proj)


def _gated_deltanet(layer, x):
    """Gated DeltaNet's block (Yang et al. 2024, Fig. 1) with log-linear weights, from the parameters."""
    h, dk, dv = layer.core_sizes
    hk = layer.num_key_heads
    qkv = causal_conv(torch.cat([linear(x, p) for p in (layer.q_proj, layer.k_proj, layer.v_proj)], -1),
                      layer.conv1d.weight)
    q, k, v = qkv.split([hk * dk, hk * dk, h * dv], -1)
    grouped = lambda t: unit(heads(t, hk)).repeat_interleave(h // hk, 1)
    g = (-layer.A_log.double().exp() * F.softplus(linear(x, layer.a_proj) + layer.dt_bias.double())).transpose(1, 2)
    beta = torch.sigmoid(linear(x, layer.b_proj)).transpose(1, 2)
    out = oracle(grouped(q) * dk ** -0.5, grouped(k), heads(v, h), g, _lambdas(layer, x, h), beta)
    gated = rms(out, 1e-6) * layer.norm.weight.double() * F.silu(heads(linear(x, layer.g_proj), h))
    return linear(merge(gated), layer.out_proj)


CASES = {
    "mamba2": (lambda: LogLinearMamba2(DIM, head_dim=4, state_dim=5, num_groups=2, chunk_size=4, max_length=32),
               _mamba2),
    "gated_deltanet": (lambda: LogLinearGatedDeltaNet(DIM, 4, num_key_heads=2, key_head_dim=5, value_head_dim=3,
                                                      chunk_size=4, max_length=32), _gated_deltanet),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_the_papers_equations_in_every_form_and_in_decoding(name):
    build, transcription = CASES[name]
    layer = _perturbed(build())
    x = torch.randn(2, 13, DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    want = transcription(layer, x)
    for form in ("parallel", "chunk", "recurrent"):
        torch.testing.assert_close(layer(x, form=form), want, rtol=0, atol=1e-10)
    assert_same_gradients(layer, x[:, :7], transcription)
    cache = layer.new_cache()
    parts = [layer(x[:, :5], cache=cache)] + [layer.forward_step(x[:, t], cache)[:, None] for t in range(5, 13)]
    torch.testing.assert_close(torch.cat(parts, 1), want, rtol=0, atol=1e-10)
    assert cache.state.shape[2] == layer.num_levels == 6 and cache.positions.tolist() == [13, 13]


@pytest.mark.parametrize(("log_linear", "base"), [
    (lambda: LogLinearMamba2(DIM, head_dim=4, state_dim=5, num_groups=2, chunk_size=4, max_length=32),
     lambda: Mamba2Mixer(DIM, head_dim=4, state_dim=5, num_groups=2, chunk_size=4)),
    (lambda: LogLinearGatedDeltaNet(DIM, 4, num_key_heads=2, chunk_size=4, max_length=32),
     lambda: GatedDeltaNet(DIM, 4, num_key_heads=2, chunk_size=4))])
def test_with_every_level_weight_one_it_is_its_base_layer(log_linear, base):
    layer = _perturbed(log_linear())
    with torch.no_grad():  # lambda = softplus(0 x + log(e - 1)) = 1
        layer.level_proj.weight.zero_()
        layer.level_proj.bias.fill_(math.log(math.e - 1))
    plain = base().double()
    plain.load_state_dict({k: v for k, v in layer.state_dict().items() if not k.startswith("level_proj")})
    x = torch.randn(2, 13, DIM, dtype=torch.float64)
    for form in ("parallel", "chunk", "recurrent"):
        torch.testing.assert_close(layer(x, form=form), plain(x, form=form), rtol=0, atol=1e-10)


def test_a_new_layer_is_its_base_layer_and_longer_sequences_than_its_levels_reach_are_refused():
    layer = LogLinearGatedDeltaNet(DIM, 4, max_length=8)
    assert torch.all(layer.level_weights(torch.randn(1, 3, DIM)) == 1.0)
    cache = layer.new_cache()
    layer(torch.randn(1, 8, DIM), cache=cache)
    with pytest.raises(UnsupportedFeature, match="give G >= 5"):
        layer.forward_step(torch.randn(1, DIM), cache)
    with pytest.raises(UnsupportedFeature, match="draft tree"):
        layer(torch.randn(1, 3, DIM), parents=[-1, 0, 1])
    with pytest.raises(UnsupportedFeature, match="positions in one sequence"):  # before any collective
        sequence_parallel(layer, torch.randn(1, 4, DIM))


@pytest.mark.parametrize("name", ["log-linear-mamba2", "log-linear-gated-deltanet"])
def test_registry_entry_runs_its_example(name):
    module, inputs = get(name).example()
    assert module(*inputs).shape == inputs[0].shape
