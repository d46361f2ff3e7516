"""The tiled additive (Bahdanau) score kernel, ``nn/additive_scores.py`` (the benchmark suite's target 6).

``additive_scores(q, k, v, max_elements=...)`` against a float64 loop transcription of
eq. A.1.2 and against autograd through the broadcast formula ``tanh(q + k) @ v``, forward
and backward, over broadcast leading dimensions and tile budgets; gradcheck and the saved
memory (never a ``(B, Lq, Lk, A)`` tensor); both tile forms (``exp`` products and
sigmoids), non-finite and bfloat16 inputs; and the whole AdditiveAttention module on the
tiled path. Float32 paths are held to the DESIGN.md rule: error vs float64 at most 2x
(3x for gradients) the error of plain float32 ``torch.tanh`` on the same inputs.
"""

from __future__ import annotations

import math

import pytest
import torch

from attnkit import masks
from attnkit.nn import additive_scores as scores_mod
from attnkit.nn.additive import AdditiveAttention, additive_scores


def _rule(got, exact, plain, factor, dtype=torch.float32):
    """DESIGN.md: max error vs float64 <= factor x the plain same-dtype error (+ a rounding floor)."""
    for g, e, p in zip(got, exact, plain, strict=True):
        err, base = (g.double() - e).abs().max().item(), (p.double() - e).abs().max().item()
        floor = 8 * torch.finfo(dtype).eps * max(1.0, e.abs().max().item())
        assert err <= factor * base + floor, (err, base)


# ------------------------------------------------------------------ against a float64 loop, tiled
def _additive_loop(q, k, v):
    """``e_ij = sum_a v_a tanh(q_ia + k_ja)`` (Bahdanau et al. 2015, eq. A.1.2), in float64 loops."""
    q, k, v = (t.double() for t in (q, k, v))
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    q, k = q.expand(*lead, *q.shape[-2:]), k.expand(*lead, *k.shape[-2:])
    out = torch.zeros(*lead, q.shape[-2], k.shape[-2], dtype=torch.float64)
    for i in range(q.shape[-2]):
        for j in range(k.shape[-2]):
            out[..., i, j] = (torch.tanh(q[..., i, :] + k[..., j, :]) * v).sum(-1)
    return out


@pytest.mark.parametrize(("q_lead", "k_lead"), [((2, 3), (2, 3)), ((2, 3), (1, 1)), ((2, 3), (2, 1)), ((1, 3), (2, 3))])
@pytest.mark.parametrize("max_elements", [1, 50, 300])
def test_tiled_additive_scores_equal_the_loop_forward_and_backward(q_lead, k_lead, max_elements):
    g = torch.Generator().manual_seed(8)
    q = torch.randn(*q_lead, 5, 11, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(*k_lead, 7, 11, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(11, generator=g, dtype=torch.float64, requires_grad=True)
    got = additive_scores(q, k, v, max_elements=max_elements)
    torch.testing.assert_close(got, _additive_loop(q, k, v), rtol=1e-12, atol=1e-12)
    w = torch.randn(got.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad((got * w).sum(), (q, k, v))
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    plain = torch.tanh(q2.unsqueeze(-2) + k2.unsqueeze(-3)) @ v2  # autograd through the broadcast formula
    for a, b in zip(grads, torch.autograd.grad((plain * w).sum(), (q2, k2, v2)), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_tiled_additive_scores_gradcheck_and_saved_memory():
    g = torch.Generator().manual_seed(9)
    q, k = (torch.randn(2, n, 3, generator=g, dtype=torch.float64, requires_grad=True) for n in (4, 5))
    v = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: additive_scores(*t, max_elements=7), (q, k, v))
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
        additive_scores(q, k, v, max_elements=7)
    assert max(sizes) < 2 * 4 * 5 * 3  # q, k and v are kept, never a (B, Lq, Lk, A) hidden tensor


# ------------------------------------------------------------------ against the float64 broadcast formula


def _broadcast(q, k, v):
    return torch.tanh(q.unsqueeze(-2) + k.unsqueeze(-3)) @ v  # the paper's equation in plain torch


def _additive_grads(fn, q, k, v, w):
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = fn(*leaves)
    return [out, *torch.autograd.grad((out * w.to(out.dtype)).sum(), leaves)]


# "products": exp(-2q), exp(-2k) stay normal floats; "edge": one pair with q + k = 0 where exp(-2q) would
# overflow and exp(-2k) be denormal (inf * tiny = inf, not 1): sigmoids; "large": |q| ~ 30, sigmoids.
@pytest.mark.parametrize("case", ["products", "edge", "large"])
@pytest.mark.parametrize("k_lead", [(2, 3), (1, 1)])
@pytest.mark.parametrize("budget", [60, 300])  # several tiles of one or more (rows, keys)
def test_tiled_additive_scores_match_float64_broadcast(case, k_lead, budget):
    g = torch.Generator().manual_seed(31)
    q = torch.randn(2, 3, 5, 11, generator=g, dtype=torch.float64) * (30.0 if case == "large" else 1.0)
    k = torch.randn(*k_lead, 7, 11, generator=g, dtype=torch.float64)
    if case == "edge":
        q[0, 0, 0, 0], k[0, 0, 0, 0] = -45.0, 45.0
    v = torch.randn(11, generator=g, dtype=torch.float64) / 3
    w = torch.randn(2, 3, 5, 7, generator=g, dtype=torch.float64)
    assert scores_mod._factors(q.float(), k.float())[2] == (case == "products")
    assert math.prod(scores_mod._tile_shape(q.reshape(6, 5, 11), k.reshape(-1, 7, 11), budget)) * 11 < 5 * 7 * 11
    got = _additive_grads(lambda *t: additive_scores(*t, max_elements=budget), q.float(), k.float(), v.float(), w)
    exact = _additive_grads(_broadcast, q, k, v, w)
    plain = _additive_grads(_broadcast, q.float(), k.float(), v.float(), w)
    _rule(got[:1], exact[:1], plain[:1], 2.0)
    _rule(got[1:], exact[1:], plain[1:], 3.0)
    got64 = _additive_grads(lambda *t: additive_scores(*t, max_elements=budget), q, k, v, w)
    for a, b in zip(got64, exact, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


def test_tiled_additive_scores_non_finite_and_half_precision():
    g = torch.Generator().manual_seed(32)
    q, k = torch.randn(2, 5, 4, generator=g), torch.randn(2, 7, 4, generator=g)
    v = torch.randn(4, generator=g)
    q[0, 1, 2], q[1, 3, 0] = float("inf"), float("nan")
    got = additive_scores(q, k, v, max_elements=9)
    exact = _broadcast(q.double(), k.double(), v.double())
    assert torch.equal(torch.isnan(got), torch.isnan(exact)) and torch.isnan(got[1, 3]).all()
    torch.testing.assert_close(got.double().nan_to_num(), exact.nan_to_num(), atol=1e-6, rtol=0)
    q[0, 1, 2], q[1, 3, 0] = 0.0, 0.0
    half = additive_scores(q.bfloat16(), k.bfloat16(), v.bfloat16(), max_elements=9)
    assert half.dtype == torch.bfloat16
    exact = _broadcast(q.bfloat16().double(), k.bfloat16().double(), v.bfloat16().double())
    torch.testing.assert_close(half.double(), exact, atol=2e-2, rtol=1e-2)


def test_additive_module_gradients_with_tiles_match_float64():
    """The whole module (projections, v, softmax) on the tiled path, every leaf's gradient."""
    torch.manual_seed(0)
    tiled = AdditiveAttention(11, 6, 8, bias=True, max_elements=50)
    g = torch.Generator().manual_seed(33)
    query, key = torch.randn(2, 5, 11, generator=g), torch.randn(2, 7, 6, generator=g)
    mask = masks.padding(torch.tensor([7, 4]))

    def grads(module, q, k, need_weights):
        leaves = [q.clone().requires_grad_(True), k.clone().requires_grad_(True)]
        out = module(*leaves, mask=mask, need_weights=need_weights).context
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(34), dtype=torch.float64)
        return [out, *torch.autograd.grad((out * w.to(out.dtype)).sum(), leaves + list(module.parameters()))]

    whole = AdditiveAttention(11, 6, 8, bias=True)
    whole.load_state_dict(tiled.state_dict())
    exact = grads(whole.double(), query.double(), key.double(), True)
    for need_weights in (True, False):
        _rule(grads(tiled, query, key, need_weights)[:1], exact[:1], grads(whole.float(), query, key, True)[:1], 2.0)
        _rule(grads(tiled, query, key, need_weights)[1:], exact[1:], grads(whole.float(), query, key, True)[1:], 3.0)
