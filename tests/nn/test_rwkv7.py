"""RWKV-7's time mixing against a float64 transcription of its block (Peng et al. 2025, arXiv:2503.14456, Sec. 4;
fla's ``RWKV7Attention`` for a first layer)."""

import math

import torch

from attnkit.nn import RWKV7TimeMixing
from attnkit.registry import get

from ..functional.recurrences.test_rwkv7 import oracle
from .recurrent_reference import assert_every_form, assert_same_gradients, heads, linear, merge

DIM, H = 12, 3


def _low_rank(x, lora, activation=None):
    h = linear(x, lora.down)
    return linear(h if activation is None else activation(h), lora.up)


def _rwkv7(layer, x):
    b, n, _ = x.shape
    d = DIM // H
    before = torch.cat([torch.zeros(b, 1, DIM, dtype=torch.float64), x[:, :-1]], 1)  # x_{t-1}, zero first
    mix = {s: x + (before - x) * getattr(layer, f"x_{s}").double() for s in "rwkvag"}
    r, k, v = (linear(mix[s], getattr(layer, f"{s}_proj")) for s in "rkv")
    w = -math.exp(-0.5) * torch.sigmoid(_low_rank(mix["w"], layer.w_lora, torch.tanh))
    a = torch.sigmoid(_low_rank(mix["a"], layer.a_lora))
    gate = _low_rank(mix["g"], layer.g_lora, torch.sigmoid)
    kappa = heads(k * layer.k_k.double(), H)
    kappa = kappa / kappa.norm(dim=-1, keepdim=True)
    k = k * (1 + (a - 1) * layer.k_a.double())
    r, k, v, w, a = (heads(t, H) for t in (r, k, v, w, a))
    out, _ = oracle(r, k, v, w, -kappa, kappa * a, torch.zeros(b, H, d, d, dtype=torch.float64))
    o = merge(out).reshape(b, n, H, d)
    mean, var = o.mean(-1, keepdim=True), o.var(-1, unbiased=False, keepdim=True)
    normed = ((o - mean) / (var + d * 1e-5).sqrt()).reshape(b, n, DIM) * layer.g_norm.weight.double() \
        + layer.g_norm.bias.double()
    bonus = merge((r * k * layer.r_k.double()[:, None]).sum(-1, keepdim=True) * v)
    return linear((normed + bonus) * gate, layer.o_proj)


def test_matches_the_papers_equations_in_every_form():
    torch.manual_seed(0)
    layer = RWKV7TimeMixing(DIM, H, decay_rank=4, a_rank=3, gate_rank=5, chunk_size=4).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randn(2, 9, DIM, dtype=torch.float64)
    assert_every_form(layer, x, _rwkv7(layer, x))
    assert_same_gradients(layer, x, _rwkv7)


def test_registry_entry_runs_its_example():
    module, inputs = get("rwkv7").example()
    assert isinstance(module, RWKV7TimeMixing) and module(*inputs).shape == inputs[0].shape
