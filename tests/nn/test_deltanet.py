"""DeltaNet against a float64 transcription of the DeltaNet layer (Yang et al. 2024, arXiv:2406.06484)."""

import pytest
import torch

from attnkit.nn import DeltaNet
from attnkit.registry import get

from .recurrent_reference import assert_every_form, causal_conv, heads, linear, merge, oracle, rms, unit

DIM, H = 12, 3


def _deltanet(layer, x, beta_max=1.0):
    qkv = causal_conv(torch.cat([linear(x, p) for p in (layer.q_proj, layer.k_proj, layer.v_proj)], -1),
                      layer.conv1d.weight)
    q, k, v = (heads(t, H) for t in qkv.split(DIM, -1))
    beta = beta_max * torch.sigmoid(linear(x, layer.b_proj)).transpose(1, 2)
    d = DIM // H
    out, _ = oracle(unit(q) * d ** -0.5, unit(k), v, torch.ones(2, H, x.shape[1], d), beta, torch.zeros(2, H, d, d))
    return linear(merge(rms(out, 1e-5) * layer.norm.weight.double()), layer.out_proj)


@pytest.mark.parametrize("allow_neg_eigval", [False, True])
def test_matches_the_papers_equations_in_every_form(allow_neg_eigval):
    torch.manual_seed(0)
    layer = DeltaNet(DIM, H, chunk_size=4, allow_neg_eigval=allow_neg_eigval).double()
    with torch.no_grad():
        layer.norm.weight.add_(torch.randn(4, dtype=torch.float64) * 0.1)
    x = torch.randn(2, 11, DIM, dtype=torch.float64)
    assert_every_form(layer, x, _deltanet(layer, x, 2.0 if allow_neg_eigval else 1.0))


def test_registry_entry_runs_its_example():
    module, inputs = get("deltanet").example()
    assert isinstance(module, DeltaNet) and module(*inputs).shape == inputs[0].shape
