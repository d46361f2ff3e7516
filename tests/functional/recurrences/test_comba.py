"""Comba against a float64 transcription of its recurrence (Hu et al. 2025, arXiv:2506.02475), in every form,
forward and backward, decoding token by token, packed documents, and fla's reference."""

import pytest
import torch
import torch.nn.functional as F

from attnkit.errors import ShapeError
from attnkit.functional.recurrences import FORMS, comba, gated_delta_rule

from .cases import unit

TOL = dict(rtol=0, atol=1e-10)
B, H, HK, N, DK, DV = 2, 4, 2, 11, 5, 3


def oracle(q, k, v, p, g, beta, state):
    """S_t = alpha_t (I - beta_t k_t p_t^T) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T q_t, explicit float64 matrices;
    q, k, p heads already repeated to the value heads, q and k normalised and scaled."""
    eye = torch.eye(q.shape[-1], dtype=torch.float64)
    s, out = state.clone(), []
    for t in range(q.shape[2]):
        kt, pt, bt = k[:, :, t, :, None], p[:, :, t, :, None], beta[:, :, t, None, None]
        s = g[:, :, t].exp()[..., None, None] * (eye - bt * kt @ pt.transpose(-1, -2)) @ s + bt * kt @ v[:, :, t,
                                                                                                         None, :]
        out.append((q[:, :, t, None, :] @ s)[:, :, 0])
    return torch.stack(out, 2), s


def problem(seed=0, b=B, n=N):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)
    q, k, p, v = rnd(b, HK, n, DK), rnd(b, HK, n, DK), 0.3 * rnd(b, HK, n, DK), rnd(b, H, n, DV)
    g, beta = F.logsigmoid(rnd(b, H, n) + 1), torch.sigmoid(rnd(b, H, n))
    return [t.requires_grad_() for t in (q, k, v, p, g, beta, rnd(b, H, DK, DV))]


def expected(q, k, v, p, g, beta, s0):
    def grouped(t):
        return t.detach().repeat_interleave(H // HK, 1)
    return oracle(grouped(unit(q)) * DK ** -0.5, grouped(unit(k)), v.detach(), grouped(p), g.detach(), beta.detach(),
                  s0.detach())


@pytest.mark.parametrize("form", FORMS)
def test_every_form_equals_the_recurrence(form):
    q, k, v, p, g, beta, s0 = problem()
    out, state = comba(q, k, v, p, g, beta, normalize_qk=True, form=form, chunk_size=4, initial_state=s0)
    want_out, want_state = expected(q, k, v, p, g, beta, s0)
    torch.testing.assert_close(out, want_out, **TOL)
    torch.testing.assert_close(state, want_state, **TOL)


def test_gradients_agree_across_forms():
    leaves = problem(1)
    w = torch.randn(B, H, N, DV, dtype=torch.float64)
    grads = []
    for form in FORMS:
        out, state = comba(*leaves[:6], normalize_qk=True, form=form, chunk_size=3, initial_state=leaves[6])
        grads.append(torch.autograd.grad((out * w).sum() + state.sum(), leaves))
    for other in grads[1:]:
        for a, e in zip(grads[0], other, strict=True):
            torch.testing.assert_close(e, a, **TOL)


def test_decoding_token_by_token_equals_the_prefill():
    q, k, v, p, g, beta, s0 = (t.detach() for t in problem(2))
    full, final = comba(q, k, v, p, g, beta, initial_state=s0)
    state, outs = s0, []
    for t in range(N):
        out, state = comba(*(x[:, :, t:t + 1] for x in (q, k, v, p, g, beta)), form="recurrent", initial_state=state)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, 2), full, **TOL)
    torch.testing.assert_close(state, final, **TOL)


def test_packed_documents_each_start_from_their_own_state():
    q, k, v, p, g, beta, _ = (t.detach() for t in problem(3, b=1))
    packed, states = comba(q, k, v, p, g, beta, cu_seqlens=torch.tensor([0, 4, 11]), chunk_size=3)
    alone, state = comba(*(x[:, :, 4:] for x in (q, k, v, p, g, beta)), form="parallel")
    torch.testing.assert_close(packed[:, :, 4:], alone, **TOL)
    torch.testing.assert_close(states[1:], state, **TOL)


def test_reading_at_the_written_key_is_the_gated_delta_rule():
    q, k, v, _, g, beta, s0 = (t.detach() for t in problem(4))
    ours = comba(q, k, v, k, g, beta, initial_state=s0)
    theirs = gated_delta_rule(q, k, v, g, beta, initial_state=s0)
    for a, e in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, e, **TOL)


def test_p_shape_is_checked():
    q, k, v, p, g, beta, _ = problem()
    with pytest.raises(ShapeError, match=r"p must have shape \(B, Hk, L, Dk\), as q = \(2, 2, 11, 5\); got "
                                         r"\(2, 2, 10, 5\)"):
        comba(q, k, v, p[:, :, 1:], g, beta)


def test_equals_flash_linear_attentions_reference():
    naive = pytest.importorskip("fla.ops.comba.naive")  # test-only oracle, computes in float32
    q, k, v, p, g, beta, s0 = (t.detach() for t in problem(5))
    q, k, p = (t.repeat_interleave(H // HK, 1) for t in (q, k, p))
    theirs, state = naive.naive_recurrent_comba(*(t.transpose(1, 2) for t in (q, k, v, p, beta, g)),
                                                initial_state=s0, output_final_state=True)
    out, final = comba(q, k, v, p, g, beta, initial_state=s0)
    torch.testing.assert_close(out, theirs.transpose(1, 2).double(), rtol=0, atol=1e-4)
    torch.testing.assert_close(final, state.double(), rtol=0, atol=1e-4)


def before_decay(q, k, v, p, g, beta, state):
    """S_t = (alpha_t I - beta_t k_t p_t^T) S_{t-1} + beta_t k_t v_t^T (the correction read before the decay)."""
    eye = torch.eye(q.shape[-1], dtype=torch.float64)
    s, out = state.clone(), []
    for t in range(q.shape[2]):
        kt, pt, bt = k[:, :, t, :, None], p[:, :, t, :, None], beta[:, :, t, None, None]
        s = (g[:, :, t].exp()[..., None, None] * eye - bt * kt @ pt.transpose(-1, -2)) @ s + bt * kt @ v[:, :, t,
                                                                                                          None, :]
        out.append((q[:, :, t, None, :] @ s)[:, :, 0])
    return torch.stack(out, 2), s


@pytest.mark.parametrize("form", FORMS)
def test_the_correction_read_before_the_decay_in_every_form(form):
    q, k, v, p, g, beta, s0 = problem(7)
    out, state = comba(q, k, v, p, g, beta, normalize_qk=True, form=form, chunk_size=4, initial_state=s0,
                       read_before_decay=True)
    grouped = lambda t: t.detach().repeat_interleave(H // HK, 1)
    want_out, want_state = before_decay(grouped(unit(q)) * DK ** -0.5, grouped(unit(k)), v.detach(), grouped(p),
                                        g.detach(), beta.detach(), s0.detach())
    torch.testing.assert_close(out, want_out, **TOL)
    torch.testing.assert_close(state, want_state, **TOL)


def test_the_correction_read_before_the_decay_equals_flash_linear_attentions_chunk_reference():
    naive = pytest.importorskip("fla.ops.comba.naive")  # test-only oracle, in float64 here
    q, k, v, p, g, beta, s0 = (t.detach() for t in problem(8))
    q, k, p = (t.repeat_interleave(H // HK, 1) for t in (q, k, p))
    theirs, state = naive.naive_chunk_comba(*(t.transpose(1, 2) for t in (q, k, v, p, g, beta)), chunk_size=4,
                                            initial_state=s0, output_final_state=True)
    out, final = comba(q, k, v, p, g, beta, initial_state=s0, read_before_decay=True)
    torch.testing.assert_close(out, theirs.transpose(1, 2).to(out.dtype), rtol=0, atol=1e-5)
    torch.testing.assert_close(final, state.to(final.dtype), rtol=0, atol=1e-5)
