"""MemoryAttention against a float64 loop transcription of Yogatama et al. 2018 (random access memory)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import gradcheck

from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.nn.memory import MemoryAttention
from attnkit.registry import get

B, T, D, K = 2, 7, 5, 3


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def ref_memory(module, h, real):
    """m_t = sum_{i=t-K}^{t-1} a_i h_i, a_i ~ exp(w_{m,i} . h_i + w_{m,h} . h_t), over real states i >= 0.

    h (T, D), real (T,) -> memory (T, D), weights (T, K) with slot j = i - (t - K).
    """
    wm, wh = module.slot_weight.detach().double(), module.state_weight.detach().double()
    kk = module.memory_size
    steps, dim = h.shape
    memory, weights = torch.zeros(steps, dim, dtype=torch.float64), torch.zeros(steps, kk, dtype=torch.float64)
    for t in range(steps):
        own = sum(float(wh[c]) * float(h[t, c]) for c in range(dim))
        scores = {}
        for i in range(t - kk, t):
            if i >= 0 and real[i]:
                j = i - (t - kk)
                scores[i] = sum(float(wm[j, c]) * float(h[i, c]) for c in range(dim)) + own
        if not scores:
            continue
        top = max(scores.values())
        total = sum(math.exp(s - top) for s in scores.values())
        for i, s in scores.items():
            a = math.exp(s - top) / total
            weights[t, i - (t - kk)] = a
            memory[t] += a * h[i]
    return memory, weights


def test_matches_equation_with_padding():
    torch.manual_seed(0)
    mem = MemoryAttention(D, K).double()
    h = _randn(B, T, D)
    real = torch.ones(B, T, dtype=torch.bool)
    real[1, 2] = False
    real[1, 5:] = False
    memory, weights = mem(h, mask=real)
    for b in range(B):
        ref_m, ref_w = ref_memory(mem, h[b], real[b])
        torch.testing.assert_close(memory[b], ref_m, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(weights[b], ref_w, rtol=1e-10, atol=1e-12)


def test_first_step_is_zero_and_window_is_k():
    mem = MemoryAttention(D, K).double()
    h = _randn(B, T, D)
    memory, weights = mem(h)
    assert torch.equal(memory[:, 0], torch.zeros(B, D, dtype=torch.float64))
    torch.testing.assert_close(weights[:, 1:].sum(-1), torch.ones(B, T - 1, dtype=torch.float64))
    # Changing a state more than K steps back, or the current/future state's slot content, never moves m_t.
    changed = h.clone()
    changed[:, 1] += 3.0
    memory2, _ = mem(changed)
    assert torch.equal(memory[:, :2], memory2[:, :2])
    assert torch.equal(memory[:, 2 + K:], memory2[:, 2 + K:])
    assert not torch.allclose(memory[:, 2:2 + K], memory2[:, 2:2 + K])


def test_state_term_cancels_in_the_weights():
    mem = MemoryAttention(D, K).double()
    h = _randn(B, T, D)
    _, weights = mem(h)
    with torch.no_grad():
        mem.state_weight.add_(_randn(D, seed=5))
    assert torch.allclose(mem(h).weights, weights, rtol=1e-12, atol=1e-14)


def test_uniform_slots_reduce_to_window_mean():
    mem = MemoryAttention(D, K).double()
    with torch.no_grad():
        mem.slot_weight.zero_()
    h = _randn(B, T, D)
    memory, _ = mem(h)
    for t in range(1, T):
        torch.testing.assert_close(memory[:, t], h[:, max(0, t - K):t].mean(1))


def test_step_equals_forward():
    mem = MemoryAttention(D, K).double()
    h = _randn(B, T, D)
    real = torch.rand(B, T, generator=torch.Generator().manual_seed(1)) > 0.3
    memory, weights = mem(h, mask=real)
    for t in range(T):
        lo = max(0, t - K)
        m_t, w_t = mem.step(h[:, t], h[:, lo:t], mask=real[:, lo:t])
        torch.testing.assert_close(m_t, memory[:, t], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(w_t, weights[:, t, K - (t - lo):], rtol=1e-12, atol=1e-14)


def test_padding_cannot_leak_and_grads_are_finite():
    mem = MemoryAttention(D, K).double()
    h = _randn(B, T, D)
    real = torch.ones(B, T, dtype=torch.bool)
    real[0, 3] = False
    clean, _ = mem(h, mask=real)
    dirty = h.masked_fill(~real[..., None], float("nan"))
    got, _ = mem(dirty, mask=real)
    assert torch.equal(got[0, 4:4 + K], clean[0, 4:4 + K])
    empty = torch.zeros(B, T, dtype=torch.bool)
    x = h.clone().requires_grad_()
    out, weights = mem(x, mask=empty)
    assert not out.any() and not weights.any()
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.isfinite(mem.slot_weight.grad).all()


def test_float32_close_to_float64():
    torch.manual_seed(0)
    mem = MemoryAttention(D, K)
    h = _randn(B, T, D)
    got, _ = mem(h.float())
    ref, _ = mem.double()(h)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)


def test_gradcheck():
    mem = MemoryAttention(3, 2).double()
    real = torch.tensor([[True, True, True, True], [True, False, True, True]])
    assert gradcheck(lambda h: mem(h, mask=real).memory, (_randn(2, 4, 3).requires_grad_(),))
    params = (mem.slot_weight, mem.state_weight)
    h = _randn(2, 4, 3)
    assert gradcheck(lambda s, w: torch.func.functional_call(mem, {"slot_weight": s, "state_weight": w}, (h,)).memory,
                     tuple(p.detach().clone().requires_grad_() for p in params))


def test_state_dict_round_trip():
    torch.manual_seed(0)
    a = MemoryAttention(D, K).double()
    torch.manual_seed(1)
    b = MemoryAttention(D, K).double()
    h = _randn(B, T, D)
    assert not torch.allclose(a(h).memory, b(h).memory)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(h).memory, b(h).memory)
    assert set(a.state_dict()) == {"slot_weight", "state_weight"}


def test_bad_inputs():
    mem = MemoryAttention(D, K)
    with pytest.raises(ShapeError, match=r"h must have shape \(batch, T, 5\)"):
        mem(torch.randn(2, 7, 4))
    with pytest.raises(DTypeError, match="mask must be a bool"):
        mem(torch.randn(2, 7, D), mask=torch.ones(2, 7))
    with pytest.raises(ShapeError, match=r"mask must have shape \(2, 7\)"):
        mem(torch.randn(2, 7, D), mask=torch.ones(7, 2, dtype=torch.bool))
    with pytest.raises(ShapeError, match="past must have shape"):
        mem.step(torch.randn(2, D), torch.randn(2, K + 1, D))
    with pytest.raises(ArgumentError, match="memory_size must be an int >= 1"):
        MemoryAttention(D, 0)


def test_registry_example_runs():
    module, inputs = get("memory-attention").example()
    out, weights = module(*inputs)
    assert out.shape == (2, 9, 8) and weights.shape == (2, 9, 4)
