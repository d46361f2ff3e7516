"""The output gate, QK-norm and partial rotary positions of MultiHeadAttention against a float64 transcription.

The reference below writes Qwen3-Next's full-attention layer out with loops over heads and
feature pairs (Qiu et al. 2025's gate, RMSNorm on q and k, RoPE on the first features in the
half-split pairing); it shares no code with the module. Reductions: a gate of exactly 1 is the
ungated module; no option is the plain module. Decoding against a KV cache equals the full pass.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import gradcheck

from attnkit import masks
from attnkit.errors import ArgumentError, DTypeError
from attnkit.nn.gated import OutputGate, QKNorm
from attnkit.nn.multihead import MultiHeadAttention
from attnkit.registry import get
from tests.helpers import randomized_float64

B, N, E, H, HKV = 2, 5, 12, 3, 1  # head_dim 4
D = E // H


def _module(*, gate=True, qk_norm=True, rotary=None):
    rotary = {"pairing": "half", "fraction": 0.5, "base": 50.0} if rotary is None else rotary
    return randomized_float64(MultiHeadAttention(E, H, batch_first=True, num_kv_heads=HKV, gate=gate,
                                                 qk_norm=qk_norm, rotary=rotary))


def _x(seed=1, n=N):
    return torch.randn(B, n, E, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@torch.no_grad()
def reference(mod, x, *, rotated=2, base=50.0, gate=True, qk_norm=True):
    """out[b, i] = W_o (concat_h sum_j softmax_j(q_hi . k_gj / sqrt(d)) v_gj * sigmoid(W_g x_i + b_g)) + b_o."""
    w = mod.in_proj_weight.double()
    bias = mod.in_proj_bias.double()
    wq, wk, wv = w[:E], w[E:E + HKV * D], w[E + HKV * D:]
    bq, bk, bv = bias[:E], bias[E:E + HKV * D], bias[E + HKV * D:]
    out = torch.zeros(B, N, E, dtype=torch.float64)
    for b in range(B):
        q = (x[b] @ wq.T + bq).reshape(N, H, D)
        k = (x[b] @ wk.T + bk).reshape(N, HKV, D)
        v = (x[b] @ wv.T + bv).reshape(N, HKV, D)
        for i in range(N):
            for h in range(H):
                g = h // (H // HKV)
                qi = _norm_rotate(q[i, h], i, mod.qk_norm.q_norm if qk_norm else None, rotated, base)
                scores = [float(qi @ _norm_rotate(k[j, g], j, mod.qk_norm.k_norm if qk_norm else None, rotated,
                                                  base)) / math.sqrt(D) for j in range(i + 1)]
                top = max(scores)
                e = [math.exp(s - top) for s in scores]
                out[b, i, h * D:(h + 1) * D] = sum(e[j] / sum(e) * v[j, g] for j in range(i + 1))
        if gate:
            out[b] = out[b] * torch.sigmoid(x[b] @ mod.gate.proj.weight.double().T + mod.gate.proj.bias.double())
    return out @ mod.out_proj.weight.double().T + mod.out_proj.bias.double()


def _norm_rotate(t, position, norm, rotated, base):
    t = t.clone()
    if norm is not None:
        t = t / math.sqrt(float((t * t).mean()) + norm.eps) * norm.weight.double()
    out = t.clone()
    for i in range(rotated // 2):
        a, c = i, i + rotated // 2
        angle = position * base ** (-2 * i / rotated)
        out[a] = t[a] * math.cos(angle) - t[c] * math.sin(angle)
        out[c] = t[c] * math.cos(angle) + t[a] * math.sin(angle)
    return out


@pytest.mark.parametrize(("gate", "qk_norm"), [(True, True), (True, False), (False, True)])
def test_gate_qk_norm_and_partial_rope_equal_the_transcription(gate, qk_norm):
    mod = _module(gate=gate, qk_norm=qk_norm)
    x = _x()
    out, _ = mod(x, x, x, is_causal=True, need_weights=False)
    torch.testing.assert_close(out, reference(mod, x, gate=gate, qk_norm=qk_norm), rtol=0, atol=1e-12)


def test_a_gate_of_one_is_the_ungated_module():
    gated, plain = _module(), _module(gate=False)
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if not k.startswith("gate.")})
    with torch.no_grad():
        gated.gate.proj.weight.zero_()
        gated.gate.proj.bias.fill_(40.0)  # sigmoid(40) rounds to 1 in float64
    x = _x()
    assert torch.sigmoid(torch.tensor(40.0, dtype=torch.float64)).item() == 1.0
    torch.testing.assert_close(gated(x, x, x, is_causal=True)[0], plain(x, x, x, is_causal=True)[0], rtol=0, atol=0)
    with torch.no_grad():
        gated.gate.proj.bias.fill_(0.0)  # and the gate is not vacuous
    assert not torch.allclose(gated(x, x, x, is_causal=True)[0], plain(x, x, x, is_causal=True)[0], atol=1e-3)


def test_no_option_is_the_plain_module_and_its_state_dict():
    plain = MultiHeadAttention(E, H, batch_first=True)
    assert (plain.gate, plain.qk_norm, plain.rotary) == (None, None, None)
    keys = set(_module().state_dict())
    assert keys - set(plain.state_dict()) == {"gate.proj.weight", "gate.proj.bias", "qk_norm.q_norm.weight",
                                              "qk_norm.k_norm.weight"}
    with pytest.raises(ArgumentError, match="torch's module has no gate, qk_norm, rotary"):
        MultiHeadAttention(E, H, gate=True, qk_norm=True, rotary=True).to_torch()


def test_decoding_with_a_cache_equals_the_full_pass():
    mod = _module(rotary={"pairing": "half", "scaling": {"type": "yarn", "factor": 2.0, "original_max_position": 4}})
    x = _x(n=7)
    full, _ = mod(x, x, x, is_causal=True)
    cache = mod.new_cache(B, 7, dtype=torch.float64)
    steps = [mod.forward_step(x[:, :4], cache)[0]] + [mod.forward_step(x[:, i:i + 1], cache)[0] for i in (4, 5, 6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-12)


def test_gradients_reach_every_parameter():
    mod = _module()
    small = _x()[:1, :3]
    assert gradcheck(lambda t: mod(t, t, t, is_causal=True)[0], (small.requires_grad_(),))
    out, _ = mod(_x(), _x(), _x(), mask=masks.causal())
    out.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mod.parameters())


def test_rotary_option_forms_and_errors():
    assert MultiHeadAttention(E, H, rotary=True).rotary.dim == D
    with pytest.raises(ArgumentError, match="rotate the head's 4 features"):
        MultiHeadAttention(E, H, rotary=__import__("attnkit").nn.RotaryEmbedding(6))
    with pytest.raises(DTypeError, match="rotary must be None, a bool"):
        MultiHeadAttention(E, H, rotary="half")
    with pytest.raises(ArgumentError, match="rotary options are base, pairing, fraction and scaling; got width"):
        MultiHeadAttention(E, H, rotary={"width": 2})


def test_the_two_modules_alone():
    g = OutputGate(5, 3, bias=False)
    out, x = torch.randn(2, 4, 3, dtype=torch.float64), torch.randn(2, 4, 5, dtype=torch.float64)
    g = g.double()
    torch.testing.assert_close(g(out, x), out / (1 + torch.exp(-(x @ g.proj.weight.T))), rtol=0, atol=1e-15)
    norm = QKNorm(4, eps=0.5).double()
    q = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    torch.testing.assert_close(norm(q, q)[0], q / torch.sqrt((q ** 2).mean(-1, keepdim=True) + 0.5), rtol=0,
                               atol=1e-15)


@pytest.mark.parametrize("name", ["gated-attention", "qk-norm"])
def test_registry_entries_run_their_examples(name):
    entry = get(name)
    fn, inputs = entry.example()
    out = fn(*inputs)
    assert out[0].shape == inputs[0].shape and "arXiv" in entry.paper
