"""DerivedKeyAttention against a float64 loop transcription of Brown et al. 2018, eqs. 5-7."""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import gradcheck

from attnkit import masks
from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.nn.derived_key import DerivedKeyAttention
from attnkit.registry import get

B, N, LQ, DV, LA = 2, 7, 5, 11, 3


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def ref_derived_key(module, value, q, allowed):
    """K_j = tanh(sum_c V_jc W_a[c, :]); d_j = exp(q . K_j) / sum over allowed; a = sum_j d_j V_j.

    value (n, Dv), q (La,), allowed (n,) -> (a (Dv,), d (n,)).
    """
    w = module.key_proj.weight.detach().double()  # (La, Dv): W_a^T
    bias = None if module.key_proj.bias is None else module.key_proj.bias.detach()
    n, la = value.shape[0], w.shape[0]
    keys = [[math.tanh(sum(float(value[j, c]) * float(w[a, c]) for c in range(value.shape[1]))
                       + (float(bias[a]) if bias is not None else 0.0)) for a in range(la)] for j in range(n)]
    scores = [sum(float(q[a]) * keys[j][a] for a in range(la)) for j in range(n)]
    d = torch.zeros(n, dtype=torch.float64)
    ok = [j for j in range(n) if allowed[j]]
    if ok:
        top = max(scores[j] for j in ok)
        total = sum(math.exp(scores[j] - top) for j in ok)
        for j in ok:
            d[j] = math.exp(scores[j] - top) / total
    return d @ value, d


@pytest.mark.parametrize("bias", [False, True])
def test_matches_equations_with_queries_and_key_mask(bias):
    torch.manual_seed(0)
    attn = DerivedKeyAttention(DV, LA, bias=bias).double()
    value, q = _randn(B, N, DV), _randn(B, LQ, LA, seed=1)
    keep = torch.arange(N) < torch.tensor([[N], [4]])
    out, weights = attn(value, q, mask=keep)
    assert out.shape == (B, LQ, DV) and weights.shape == (B, LQ, N)
    for b in range(B):
        for i in range(LQ):
            ref_a, ref_d = ref_derived_key(attn, value[b], q[b, i], keep[b])
            torch.testing.assert_close(out[b, i], ref_a, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(weights[b, i], ref_d, rtol=1e-10, atol=1e-12)


def test_learned_query_and_single_query():
    torch.manual_seed(0)
    attn = DerivedKeyAttention(DV, LA, learned_query=True).double()
    value = _randn(B, N, DV)
    out, weights = attn(value)
    assert out.shape == (B, DV) and weights.shape == (B, N)
    for b in range(B):
        ref_a, ref_d = ref_derived_key(attn, value[b], attn.query.detach(), [True] * N)
        torch.testing.assert_close(out[b], ref_a, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(weights[b], ref_d, rtol=1e-10, atol=1e-12)
    q = _randn(B, LA, seed=3)
    one, _ = attn(value, q)
    many, _ = attn(value, q[:, None, :])
    torch.testing.assert_close(one, many[:, 0], rtol=0, atol=0)


def test_per_query_mask_and_fully_masked_row():
    attn = DerivedKeyAttention(DV, LA).double()
    value, q = _randn(B, N, DV), _randn(B, LQ, LA, seed=1).requires_grad_()
    allowed = torch.rand(B, LQ, N, generator=torch.Generator().manual_seed(2)) > 0.4
    allowed[1, 2] = False
    out, weights = attn(value, q, mask=allowed)
    for b in range(B):
        for i in range(LQ):
            ref_a, ref_d = ref_derived_key(attn, value[b], q[b, i].detach(), allowed[b, i])
            torch.testing.assert_close(out[b, i], ref_a, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(weights[b, i], ref_d, rtol=1e-10, atol=1e-12)
    assert torch.equal(out[1, 2], torch.zeros(DV, dtype=torch.float64))
    out.sum().backward()
    assert torch.isfinite(q.grad).all() and not q.grad[1, 2].any()


def test_causal_mask_object_keeps_the_past_fixed():
    attn = DerivedKeyAttention(DV, LA).double()
    value, q = _randn(B, N, DV), _randn(B, N, LA, seed=1)
    out, weights = attn(value, q, mask=masks.causal())
    assert torch.equal(weights.triu(1), torch.zeros_like(weights))
    changed = value.clone()
    changed[:, 4:] += 1.0
    out2, _ = attn(changed, q, mask=masks.causal())
    assert torch.equal(out[:, :4], out2[:, :4]) and not torch.allclose(out[:, 4:], out2[:, 4:])


def test_masked_values_cannot_leak():
    attn = DerivedKeyAttention(DV, LA).double()
    value, q = _randn(B, N, DV), _randn(B, LQ, LA, seed=1)
    keep = torch.arange(N) < torch.tensor([[5], [3]])
    clean, _ = attn(value, q, mask=keep)
    dirty, _ = attn(value.masked_fill(~keep[..., None], float("nan")), q, mask=keep)
    assert torch.equal(clean, dirty)


def test_float32_close_to_float64():
    torch.manual_seed(0)
    attn = DerivedKeyAttention(DV, LA)
    value, q = _randn(B, N, DV), _randn(B, LQ, LA, seed=1)
    got, _ = attn(value.float(), q.float())
    ref, _ = attn.double()(value, q)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)


def test_gradcheck():
    attn = DerivedKeyAttention(4, 3, learned_query=True, bias=True).double()
    keep = torch.tensor([[True, True, False], [True, True, True]])
    value, q = _randn(2, 3, 4).requires_grad_(), _randn(2, 2, 3, seed=1).requires_grad_()
    assert gradcheck(lambda v, q: attn(v, q, mask=keep).output, (value, q))
    assert gradcheck(lambda v: attn(v).output, (value,))


def test_state_dict_round_trip():
    torch.manual_seed(0)
    a = DerivedKeyAttention(DV, LA, learned_query=True).double()
    torch.manual_seed(1)
    b = DerivedKeyAttention(DV, LA, learned_query=True).double()
    value = _randn(B, N, DV)
    assert not torch.allclose(a(value).output, b(value).output)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(value).output, b(value).output)
    assert set(a.state_dict()) == {"key_proj.weight", "query"}


def test_bad_inputs():
    attn = DerivedKeyAttention(4, 3)
    with pytest.raises(ShapeError, match=r"value must have shape \(batch, n, 4\)"):
        attn(torch.randn(2, 5, 3), torch.randn(2, 3))
    with pytest.raises(ShapeError, match=r"query must have shape"):
        attn(torch.randn(2, 5, 4), torch.randn(2, 4))
    with pytest.raises(ShapeError, match=r"query must have shape"):
        attn(torch.randn(2, 5, 4), torch.randn(3, 2, 3))
    with pytest.raises(ArgumentError, match="learned_query=True"):
        attn(torch.randn(2, 5, 4))
    with pytest.raises(DTypeError, match="mask must be a bool"):
        attn(torch.randn(2, 5, 4), torch.randn(2, 3), mask=torch.ones(2, 5))
    with pytest.raises(ShapeError, match=r"mask must have shape \(batch, n\) = \(2, 5\)"):
        attn(torch.randn(2, 5, 4), torch.randn(2, 3), mask=torch.ones(5, 2, dtype=torch.bool))


def test_registry_example_runs():
    module, inputs = get("derived-key").example()
    out, weights = module(*inputs)
    assert out.shape == (2, 5, 8) and weights.shape == (2, 5, 7)
