"""RetNetRetention against a float64 transcription of multi-scale retention (Sun et al. 2023, eq. 5-8)."""

import torch
import torch.nn.functional as F

from attnkit.nn import RetNetRetention
from attnkit.registry import get

from .recurrent_reference import assert_every_form, heads, linear, merge

DIM, H = 12, 3


def _rotate(x):
    """Adjacent feature pairs of the token at position m rotated by m * 10000^(-2i / d) (x: (b, h, n, d))."""
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.arange(x.shape[2], dtype=torch.float64)[:, None] * theta  # (n, d / 2)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * angle.cos() - odd * angle.sin(), odd * angle.cos() + even * angle.sin()], -1).flatten(-2)


def _msr(layer, x):
    q, k = _rotate(heads(linear(x, layer.q_proj), H)), _rotate(heads(linear(x, layer.k_proj), H))
    v = heads(linear(x, layer.v_proj), H)
    n = x.shape[1]
    gamma = 1 - 2.0 ** (-5 - torch.arange(H, dtype=torch.float64))
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    decay = torch.where(i >= j, gamma[:, None, None] ** (i - j).clamp(min=0), 0.0)  # D, one per head
    y = ((q @ k.transpose(-1, -2)) / (DIM // H) ** 0.5 * decay) @ v  # (b, h, n, 2d)
    mean, var = y.mean(-1, keepdim=True), y.var(-1, unbiased=False, keepdim=True)
    y = merge((y - mean) / (var + layer.norm.eps).sqrt()) * layer.norm.weight.double() + layer.norm.bias.double()
    return linear(F.silu(linear(x, layer.g_proj)) * y, layer.out_proj)


def test_matches_the_papers_equations_in_every_form():
    torch.manual_seed(0)
    layer = RetNetRetention(DIM, H, chunk_size=4).double()
    with torch.no_grad():
        layer.norm.weight.add_(torch.randn(layer.norm.weight.shape, dtype=torch.float64) * 0.1)
        layer.norm.bias.add_(torch.randn(layer.norm.bias.shape, dtype=torch.float64) * 0.1)
    x = torch.randn(2, 11, DIM, dtype=torch.float64)
    assert_every_form(layer, x, _msr(layer, x))


def test_registry_entry_runs_its_example():
    entry = get("retnet")
    module, inputs = entry.example()
    assert entry.target is RetNetRetention and module(*inputs).shape == inputs[0].shape
