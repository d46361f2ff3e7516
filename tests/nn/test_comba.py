"""Comba against a float64 transcription of its layer (Hu et al. 2025, arXiv:2506.02475; fla's ``Comba`` block)."""

import pytest
import torch
import torch.nn.functional as F

from attnkit.nn import Comba
from attnkit.registry import get

from ..functional.recurrences.test_comba import before_decay, oracle
from .recurrent_reference import assert_every_form, assert_same_gradients, causal_conv, heads, linear, merge, rms, unit

DIM, H, HK, DK, DV = 12, 4, 2, 5, 3


def _comba(layer, x, beta_max, read_before_decay):
    qkv = causal_conv(torch.cat([linear(x, p) for p in (layer.q_proj, layer.k_proj, layer.v_proj)], -1),
                      layer.conv1d.weight)
    q, k, v = qkv.split([HK * DK, HK * DK, H * DV], -1)
    q, k, v = unit(heads(q, HK)), unit(heads(k, HK)), heads(v, H)
    p = torch.sigmoid(layer.decay.double())[:, None, None] * k  # the correction's key, per key head
    q = q - layer.D.double()[:, None, None] * p  # the output correction
    g = (-layer.A_log.double().exp() * F.softplus(linear(x, layer.a_proj) + layer.dt_bias.double())).transpose(1, 2)
    beta = beta_max * torch.sigmoid(linear(x, layer.b_proj)).transpose(1, 2)
    grouped = lambda t: t.repeat_interleave(H // HK, 1)
    recurrence = before_decay if read_before_decay else oracle
    out, _ = recurrence(grouped(q) * DK ** -0.5, grouped(k), v, grouped(p), g, beta,
                        torch.zeros(x.shape[0], H, DK, DV, dtype=torch.float64))
    gated = rms(out, 1e-5) * layer.norm.weight.double() * torch.sigmoid(heads(linear(x, layer.g_proj), H))
    return linear(merge(gated), layer.out_proj)


@pytest.mark.parametrize(("allow_neg_eigval", "read_before_decay"), [(False, True), (True, True), (False, False)])
def test_matches_the_papers_equations_in_every_form(allow_neg_eigval, read_before_decay):
    torch.manual_seed(0)
    layer = Comba(DIM, H, num_key_heads=HK, key_head_dim=DK, value_head_dim=DV, chunk_size=4,
                  allow_neg_eigval=allow_neg_eigval, read_before_decay=read_before_decay).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randn(2, 9, DIM, dtype=torch.float64)
    assert_every_form(layer, x, _comba(layer, x, 2.0 if allow_neg_eigval else 1.0, read_before_decay))
    assert_same_gradients(layer, x, lambda m, t: _comba(m, t, 2.0 if allow_neg_eigval else 1.0, read_before_decay))


def test_registry_entry_runs_its_example():
    module, inputs = get("comba").example()
    assert isinstance(module, Comba) and module(*inputs).shape == inputs[0].shape
