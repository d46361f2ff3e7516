"""GatedLinearAttention against a float64 transcription of the GLA layer (Yang et al. 2023, Sec. 4)."""

import torch
import torch.nn.functional as F

from attnkit.nn import GatedLinearAttention
from attnkit.registry import get

from .recurrent_reference import assert_every_form, heads, linear, merge, oracle

DIM, H = 12, 2


def _gla(layer, x):
    q, k, v = (heads(linear(x, p), H) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    alpha = torch.sigmoid(linear(linear(x, layer.gate_down), layer.gate_up)) ** (1 / 16)  # (b, n, dk)
    out, _ = oracle(q * q.shape[-1] ** -0.5, k, v, heads(alpha, H), None, torch.zeros(2, H, 3, 6))
    mean, var = out.mean(-1, keepdim=True), out.var(-1, unbiased=False, keepdim=True)
    normed = (out - mean) / (var + 1e-5).sqrt() * layer.norm.weight.double() + layer.norm.bias.double()
    return linear(F.silu(linear(x, layer.r_proj)) * merge(normed), layer.out_proj)


def test_matches_the_papers_equations_in_every_form():
    torch.manual_seed(0)
    layer = GatedLinearAttention(DIM, H, chunk_size=4).double()
    x = torch.randn(2, 11, DIM, dtype=torch.float64)
    assert_every_form(layer, x, _gla(layer, x))


def test_registry_entry_runs_its_example():
    module, inputs = get("gla").example()
    assert isinstance(module, GatedLinearAttention) and module(*inputs).shape == inputs[0].shape
