"""DeltaProduct against a float64 transcription of the Gated DeltaProduct layer (Siems et al. 2025,
arXiv:2502.10297, Sec. 3)."""

import pytest
import torch
import torch.nn.functional as F

from attnkit.nn import DeltaProduct
from attnkit.registry import get

from ..functional.recurrences.test_delta_product import oracle
from .recurrent_reference import assert_every_form, causal_conv, heads, linear, merge, rms, unit

DIM, H, NH = 12, 3, 3


def _delta_product(layer, x, beta_max):
    n, d = x.shape[1], DIM // H
    qkv = causal_conv(torch.cat([linear(x, p) for p in (layer.q_proj, layer.k_proj, layer.v_proj)], -1),
                      layer.conv1d.weight)
    q, k, v = qkv.split([DIM, NH * DIM, NH * DIM], -1)
    # head h's n_h keys sit side by side: features (H, n_h, d); token t's steps at t n_h .. t n_h + n_h - 1
    k, v = (t.reshape(2, n, H, NH, d).permute(0, 2, 1, 3, 4).reshape(2, H, n * NH, d) for t in (k, v))
    beta = beta_max * torch.sigmoid(linear(x, layer.b_proj)).reshape(2, n, H, NH).permute(0, 2, 1, 3).reshape(
        2, H, n * NH)
    g = None
    if layer.learned_decay:
        rate = F.softplus(linear(x, layer.a_proj) + layer.dt_bias.double())
        g = (-layer.A_log.double().exp() * rate).transpose(1, 2)
    out, _ = oracle(unit(heads(q, H)) * d ** -0.5, unit(k), v, beta, g, NH, torch.zeros(2, H, d, d,
                                                                                          dtype=torch.float64))
    gated = rms(out, 1e-6) * layer.norm.weight.double() * F.silu(heads(linear(x, layer.g_proj), H))
    return linear(merge(gated), layer.out_proj)


@pytest.mark.parametrize(("forget_gate", "allow_neg_eigval"), [(True, False), (False, True), (True, True)])
def test_matches_the_papers_equations_in_every_form(forget_gate, allow_neg_eigval):
    torch.manual_seed(0)
    layer = DeltaProduct(DIM, H, num_householder=NH, forget_gate=forget_gate, allow_neg_eigval=allow_neg_eigval,
                         chunk_size=4).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randn(2, 7, DIM, dtype=torch.float64)
    assert_every_form(layer, x, _delta_product(layer, x, 2.0 if allow_neg_eigval else 1.0))


def test_registry_entry_runs_its_example():
    module, inputs = get("delta-product").example()
    assert isinstance(module, DeltaProduct) and module(*inputs).shape == inputs[0].shape
