"""DifferentialAttention against Ye et al. 2024's eqs. 1-3 written out in float64; lambda = 0 is one softmax.

The reference computes the two softmax maps of each head with loops, subtracts them with
lambda (eq. 2), normalises each head and scales by ``1 - lambda_init`` (eq. 3); it shares no
code with the module, which runs two calls of attnkit.attention over half-values.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import gradcheck

from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.nn.differential import DifferentialAttention, lambda_init
from attnkit.nn.kv_cache import KVCache
from attnkit.registry import get
from tests.helpers import randomized_float64

B, N, H, G = 2, 5, 3, 1
D = 2  # per map; values 2 D = 4
DIM = 2 * H * D


def _module(*, kv=G, causal=True, init=0.35, rotary=None):
    diff = DifferentialAttention(DIM, H, num_kv_heads=kv, lambda_init=init, causal=causal, rotary=rotary, bias=True)
    return randomized_float64(diff).eval()


def _x(n=N, seed=1):
    return torch.randn(B, n, DIM, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _softmax_row(q, keys):
    s = [float(q @ k) / math.sqrt(len(q)) for k in keys]
    top = max(s)
    e = [math.exp(v - top) for v in s]
    return [v / sum(e) for v in e]


@torch.no_grad()
def reference(m, x, keep=None):
    g = m.num_kv_heads
    lam = math.exp(float(m.lambda_q1 @ m.lambda_k1)) - math.exp(float(m.lambda_q2 @ m.lambda_k2)) + m.lambda_init
    out = torch.zeros(B, x.shape[1], DIM, dtype=torch.float64)
    for b in range(B):
        q = (x[b] @ m.q_proj.weight.T + m.q_proj.bias).reshape(-1, 2, H, D)  # [Q1; Q2] per head
        k = (x[b] @ m.k_proj.weight.T + m.k_proj.bias).reshape(-1, 2, g, D)
        v = (x[b] @ m.v_proj.weight.T + m.v_proj.bias).reshape(-1, 2, g, D)
        for t in range(x.shape[1]):
            heads = []
            for i in range(H):
                j = i // (H // g)
                seen = [s for s in range(x.shape[1]) if (s <= t or not m.causal) and (keep is None or keep[b, s])]
                a1 = _softmax_row(q[t, 0, i], [k[s, 0, j] for s in seen])
                a2 = _softmax_row(q[t, 1, i], [k[s, 1, j] for s in seen])
                value = [torch.cat([v[s, 0, j], v[s, 1, j]]) for s in seen]  # 2d wide
                head = sum((a1[n] - lam * a2[n]) * value[n] for n in range(len(seen)))  # eq. 1
                rms = math.sqrt(float((head * head).mean()) + m.norm.eps)
                heads.append((1 - m.lambda_init) * head / rms)  # eq. 3
            out[b, t] = torch.cat(heads) @ m.out_proj.weight.T + m.out_proj.bias
    return out


@pytest.mark.parametrize("kv", [1, 3])
def test_equals_the_papers_equations(kv):
    m = _module(kv=kv)
    x = _x()
    torch.testing.assert_close(m(x), reference(m, x), rtol=0, atol=1e-12)


def test_bidirectional_with_padding():
    m = _module(causal=False)
    x, keep = _x(), torch.tensor([[True] * 5, [False, True, True, False, True]])
    torch.testing.assert_close(m(x, key_keep_mask=keep), reference(m, x, keep), rtol=0, atol=1e-12)


def test_lambda_zero_is_one_softmax():
    m = _module(init=0.0)
    with torch.no_grad():
        for p in (m.lambda_q1, m.lambda_k1, m.lambda_q2, m.lambda_k2):
            p.zero_()  # exp(0) - exp(0) + 0
    assert m.weight().item() == 0.0
    x = _x()
    with torch.no_grad():
        q = (x @ m.q_proj.weight.T + m.q_proj.bias).unflatten(-1, (2, H, D))[:, :, 0]  # Q1 only
        k = (x @ m.k_proj.weight.T + m.k_proj.bias).unflatten(-1, (2, G, D))[:, :, 0]
        v = (x @ m.v_proj.weight.T + m.v_proj.bias).unflatten(-1, (2, G, D)).transpose(2, 3).flatten(-2)  # (B,n,G,2D)
        scores = torch.einsum("bihd,bjd->bhij", q, k[:, :, 0]) / math.sqrt(D)
        scores = scores.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
        heads = torch.einsum("bhij,bjd->bihd", scores.softmax(-1), v[:, :, 0])  # (B, n, H, 2D)
        heads = heads / torch.sqrt((heads ** 2).mean(-1, keepdim=True) + m.norm.eps)
        want = heads.flatten(-2) @ m.out_proj.weight.T + m.out_proj.bias
    torch.testing.assert_close(m(x), want, rtol=0, atol=1e-12)
    with torch.no_grad():
        m.lambda_init = 0.5  # and lambda is not vacuous
    assert not torch.allclose(m(x), want, atol=1e-3)


def test_decoding_with_a_cache_equals_the_full_pass():
    m = _module(kv=1, rotary={"pairing": "half"})
    x = _x(n=8)
    cache = m.new_cache(B, 8)
    steps = torch.cat([m(x[:, :3], cache=cache)] + [m(x[:, i:i + 1], cache=cache) for i in range(3, 8)], 1)
    torch.testing.assert_close(steps, m(x), rtol=0, atol=1e-12)
    assert cache.shape == (B, 2 * 1, 8, D)
    with pytest.raises(ShapeError, match="cache must have 2 heads of 2 features"):
        m(x, cache=KVCache(B, 8, 3, D))


def test_gradients_reach_every_parameter():
    m = _module()
    assert gradcheck(lambda t: m(t), (_x()[:1, :3].requires_grad_(),))
    m(_x()).sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_lambda_init_schedule_and_errors():
    assert lambda_init(0) == pytest.approx(0.2) and lambda_init(9) == pytest.approx(0.8 - 0.6 * math.exp(-2.7))
    with pytest.raises(ArgumentError, match="divisible by 2 \\* num_heads"):
        DifferentialAttention(10, 3)
    with pytest.raises(ArgumentError, match="lambda_init must be a finite number"):
        DifferentialAttention(12, 3, lambda_init=float("nan"))
    with pytest.raises(DTypeError, match="cache must be a KVCache"):
        _module()(_x(), cache=object())


def test_registry_entry_and_cache_bytes():
    entry = get("differential")
    fn, inputs = entry.example()
    assert fn(*inputs).shape == inputs[0].shape and entry.cost().state_per_token == 4 * 3 * 4 * 4
