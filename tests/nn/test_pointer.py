"""PointerAttention against a float64 loop transcription of Vinyals et al. 2015, eq. 3."""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import gradcheck

from attnkit.errors import DTypeError, ShapeError
from attnkit.nn.pointer import PointerAttention
from attnkit.registry import get

B, LQ, N, DE, DD, A = 2, 3, 7, 5, 4, 6


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def ref_pointer(module, d, e, allowed):
    """u_j = sum_a v_a tanh(sum_c W1[a, c] e_jc + sum_c W2[a, c] d_c); log p_j = u_j - log sum_{allowed} exp(u).

    d (Dd,), e (n, De), allowed (n,) -> log p (n,), -inf where not allowed.
    """
    w1, w2, v = (t.detach().double() for t in (module.encoder_proj.weight, module.decoder_proj.weight, module.v))
    u = []
    for j in range(e.shape[0]):
        total = 0.0
        for a in range(v.shape[0]):
            pre = sum(float(w1[a, c] * e[j, c]) for c in range(e.shape[1]))
            pre += sum(float(w2[a, c] * d[c]) for c in range(d.shape[0]))
            total += float(v[a]) * math.tanh(pre)
        u.append(total)
    ok = [j for j in range(len(u)) if allowed[j]]
    out = torch.full((len(u),), float("-inf"), dtype=torch.float64)
    if ok:
        top = max(u[j] for j in ok)
        lse = top + math.log(sum(math.exp(u[j] - top) for j in ok))
        for j in ok:
            out[j] = u[j] - lse
    return out


def test_matches_equation_with_mask():
    torch.manual_seed(0)
    ptr = PointerAttention(DE, DD, A).double()
    dec, enc = _randn(B, LQ, DD), _randn(B, N, DE, seed=1)
    allowed = torch.rand(B, LQ, N, generator=torch.Generator().manual_seed(2)) > 0.3
    logp = ptr(dec, enc, mask=allowed)
    for b in range(B):
        for i in range(LQ):
            torch.testing.assert_close(logp[b, i], ref_pointer(ptr, dec[b, i], enc[b], allowed[b, i]),
                                       rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(B, LQ, dtype=torch.float64))


def test_single_step_and_key_mask_shapes():
    ptr = PointerAttention(DE, DD, A).double()
    dec, enc = _randn(B, DD), _randn(B, N, DE, seed=1)
    keep = torch.arange(N) < torch.tensor([[N], [4]])
    logp = ptr(dec, enc, mask=keep)
    assert logp.shape == (B, N)
    for b in range(B):
        torch.testing.assert_close(logp[b], ref_pointer(ptr, dec[b], enc[b], keep[b]), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(ptr(dec, enc)[0], ptr(dec[:, None], enc)[0, 0], rtol=0, atol=0)


def test_is_log_softmax_of_the_scores():
    ptr = PointerAttention(DE, DD, A).double()
    dec, enc = _randn(B, LQ, DD), _randn(B, N, DE, seed=1)
    torch.testing.assert_close(ptr(dec, enc), torch.log_softmax(ptr.scores(dec, enc), -1), rtol=1e-12, atol=1e-14)


def test_greedy_decoding_with_chosen_mask_is_a_permutation():
    ptr = PointerAttention(DE, DD, A).double()
    enc, dec = _randn(B, N, DE, seed=1), _randn(B, N, DD, seed=2)
    available = torch.ones(B, N, dtype=torch.bool)
    order = []
    for i in range(N):
        logp = ptr(dec[:, i], enc, mask=available)
        assert torch.isneginf(logp[~available]).all()
        pick = logp.argmax(-1)
        order.append(pick)
        available = available.scatter(1, pick[:, None], False)
    order = torch.stack(order, 1)
    assert torch.equal(order.sort(1).values, torch.arange(N).expand(B, N))
    logp = ptr(dec[:, 0], enc, mask=available)  # nothing left: all -inf, never NaN
    assert torch.isneginf(logp).all()


def test_fully_masked_row_has_zero_gradients():
    ptr = PointerAttention(DE, DD, A).double()
    dec, enc = _randn(B, LQ, DD).requires_grad_(), _randn(B, N, DE, seed=1).requires_grad_()
    allowed = torch.ones(B, LQ, N, dtype=torch.bool)
    allowed[1, 1] = False
    logp = ptr(dec, enc, mask=allowed)
    assert torch.isneginf(logp[1, 1]).all() and not logp.isnan().any()
    logp.masked_fill(~allowed, 0.0).sum().backward()
    assert torch.isfinite(dec.grad).all() and torch.isfinite(enc.grad).all()
    assert not dec.grad[1, 1].any()


def test_nan_in_allowed_input_propagates():
    ptr = PointerAttention(DE, DD, A).double()
    enc = _randn(B, N, DE, seed=1)
    enc[0, 2, 0] = float("nan")
    logp = ptr(_randn(B, DD), enc)
    assert logp[0].isnan().all() and not logp[1].isnan().any()


def test_float32_close_to_float64():
    torch.manual_seed(0)
    ptr = PointerAttention(DE, DD, A)
    dec, enc = _randn(B, LQ, DD), _randn(B, N, DE, seed=1)
    got = ptr(dec.float(), enc.float())
    ref = ptr.double()(dec, enc)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5)


def test_gradcheck():
    ptr = PointerAttention(3, 2, 4).double()
    allowed = torch.tensor([[True, False, True, True], [True, True, True, True]])
    dec, enc = _randn(2, 3, 2).requires_grad_(), _randn(2, 4, 3, seed=1).requires_grad_()

    def f(d, e):
        return ptr(d, e, mask=allowed).masked_fill(~allowed[:, None, :], 0.0)

    assert gradcheck(f, (dec, enc))


def test_state_dict_round_trip():
    torch.manual_seed(0)
    a = PointerAttention(DE, DD, A).double()
    torch.manual_seed(1)
    b = PointerAttention(DE, DD, A).double()
    dec, enc = _randn(B, LQ, DD), _randn(B, N, DE, seed=1)
    assert not torch.allclose(a(dec, enc), b(dec, enc))
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(dec, enc), b(dec, enc))
    assert set(a.state_dict()) == {"encoder_proj.weight", "decoder_proj.weight", "v"}


def test_bad_inputs():
    ptr = PointerAttention(DE, DD, A)
    with pytest.raises(ShapeError, match=r"encoder must have shape \(batch, n, 5\)"):
        ptr(torch.randn(B, DD), torch.randn(B, N, DD))
    with pytest.raises(ShapeError, match=r"decoder must have shape \(batch, 4\)"):
        ptr(torch.randn(B, DE), torch.randn(B, N, DE))
    with pytest.raises(ShapeError, match="batch=2"):
        ptr(torch.randn(3, DD), torch.randn(B, N, DE))
    with pytest.raises(DTypeError, match="mask must be a bool"):
        ptr(torch.randn(B, DD), torch.randn(B, N, DE), mask=torch.ones(B, N))
    with pytest.raises(ShapeError, match=r"mask must have shape \(batch, n\) = \(2, 7\)"):
        ptr(torch.randn(B, DD), torch.randn(B, N, DE), mask=torch.ones(N, B, dtype=torch.bool))


def test_registry_example_runs():
    module, inputs = get("pointer").example()
    assert module(*inputs).shape == (2, 3, 7)
