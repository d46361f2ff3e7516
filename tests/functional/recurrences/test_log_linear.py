"""Log-linear attention (Guo et al. 2025, arXiv:2506.04761) against a float64 transcription: every pair (t, s)
weighted by lambda_t at the Fenwick level of t XOR s, times the recurrence's own transfer from s to t, built as
explicit matrix products; in every form, forward and backward, decoding token by token, and with every weight 1
equal to Mamba-2 (ssd) and Gated DeltaNet."""

import pytest
import torch
import torch.nn.functional as F

from attnkit.errors import ShapeError, UnsupportedFeature
from attnkit.functional.recurrences import FORMS, gated_delta_rule, ssd
from attnkit.functional.recurrences.log_linear import levels_for, log_linear_attention

TOL = dict(rtol=0, atol=1e-10)
B, H, HK, N, DK, DV = 2, 4, 2, 13, 5, 3


def oracle(q, k, v, g, lam, beta=None, offset=0):
    """o_t = sum_{s<=t} lam_t[level(t, s)] q_t^T (A_t ... A_{s+1}) b_s k_s v_s^T, explicit float64 matrices;
    A_r = exp(g_r) (I - beta_r k_r k_r^T) (exp(g_r) I without beta), b_s = beta_s (1 without), q, k per value head."""
    b, h, n, dk = q.shape
    eye = torch.eye(dk, dtype=torch.float64)
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    for t in range(n):
        transfer = eye.expand(b, h, dk, dk).clone()  # A_t ... A_{s+1}, grown as s goes down
        for s in range(t, -1, -1):
            strength = 1.0 if beta is None else beta[:, :, s, None]
            p = (q[:, :, t, None, :] @ transfer @ k[:, :, s, :, None])[..., 0, 0] * (
                strength[..., 0] if beta is not None else 1.0)
            level = ((t + offset) ^ (s + offset)).bit_length()
            out[:, :, t] += (lam[:, :, t, level] * p)[..., None] * v[:, :, s]
            a = g[:, :, s].exp()[..., None, None] * eye
            if beta is not None:
                a = a @ (eye - beta[:, :, s, None, None] * k[:, :, s, :, None] @ k[:, :, s, None, :])
            transfer = transfer @ a
    return out


def problem(seed=0, n=N, delta=True, levels=None):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)
    q, k, v = rnd(B, HK, n, DK), rnd(B, HK, n, DK), rnd(B, H, n, DV)
    g = F.logsigmoid(rnd(B, H, n) + 1)
    lam = torch.rand(B, H, n, levels or levels_for(n), generator=gen, dtype=torch.float64) * 2
    beta = torch.sigmoid(rnd(B, H, n)) if delta else None
    return q, k, v, g, lam, beta


def expected(q, k, v, g, lam, beta, offset=0):
    """The oracle on q, k already normalised (as the function's normalize_qk), q scaled, heads repeated."""
    def grouped(t):
        return t.repeat_interleave(H // HK, 1)
    return oracle(grouped(q * DK ** -0.5), grouped(k), v, g, lam, beta, offset)


def _unit(t):
    return t / (t.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()


@pytest.mark.parametrize("delta", [False, True])
@pytest.mark.parametrize("form", FORMS)
def test_every_form_equals_the_transcription(form, delta):
    q, k, v, g, lam, beta = problem(delta=delta)
    out, _ = log_linear_attention(q, k, v, g, lam, beta, normalize_qk=delta, form=form, chunk_size=4)
    qn, kn = (_unit(t) for t in (q, k)) if delta else (q, k)
    torch.testing.assert_close(out, expected(qn, kn, v, g, lam, beta), **TOL)


@pytest.mark.parametrize("delta", [False, True])
def test_gradients_agree_across_forms_and_with_the_transcription(delta):
    q, k, v, g, lam, beta = problem(1, n=9, delta=delta)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, g, lam) + ((beta,) if delta else ())]
    w = torch.randn(B, H, 9, DV, dtype=torch.float64)
    grads = []
    for form in FORMS:
        out, _ = log_linear_attention(*leaves[:5], leaves[5] if delta else None, form=form, chunk_size=4)
        grads.append(torch.autograd.grad((out * w).sum(), leaves))
    want = torch.autograd.grad((oracle(*(t.repeat_interleave(H // HK, 1) * (DK ** -0.5 if i == 0 else 1)
                                         for i, t in enumerate(leaves[:2])), *leaves[2:5],
                                       leaves[5] if delta else None) * w).sum(), leaves)
    for got in grads:
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("delta", [False, True])
@pytest.mark.parametrize("form", FORMS)
def test_decoding_step_by_step_and_in_pieces_equals_the_prefill(form, delta):
    q, k, v, g, lam, beta = problem(2, delta=delta)
    full, final = log_linear_attention(q, k, v, g, lam, beta, chunk_size=4)
    state, parts = None, []
    for lo, hi in ((0, 3), (3, 4), (4, 9), (9, 10), (10, 13)):
        out, state = log_linear_attention(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], g[:, :, lo:hi],
                                          lam[:, :, lo:hi], None if beta is None else beta[:, :, lo:hi],
                                          form=form, chunk_size=2, initial_state=state, offset=lo)
        parts.append(out)
    torch.testing.assert_close(torch.cat(parts, 2), full, **TOL)
    torch.testing.assert_close(state, final, **TOL)


def test_the_recurrence_comes_back_with_every_level_weight_one():
    q, k, v, g, _, beta = problem(3)
    ones = torch.ones(B, H, N, levels_for(N), dtype=torch.float64)
    dt = torch.rand(B, H, N, dtype=torch.float64) + 0.1
    a = -torch.rand(H, dtype=torch.float64) - 0.5
    base, _ = ssd(v, dt, a, k, q, form="recurrent")  # Mamba-2: k = B, q = C, values dt x, log decay dt A
    for form in FORMS:
        ours, _ = log_linear_attention(q, k, v * dt[..., None], dt * a[:, None], ones, scale=1.0, form=form,
                                       chunk_size=4)
        torch.testing.assert_close(ours, base, **TOL)
        gdn, _ = gated_delta_rule(q, k, v, g, beta, normalize_qk=True, form="recurrent")
        ours, _ = log_linear_attention(q, k, v, g, ones, beta, normalize_qk=True, form=form, chunk_size=4)
        torch.testing.assert_close(ours, gdn, **TOL)


def test_dropped_tokens_take_no_position_and_change_nothing():
    q, k, v, g, lam, beta = problem(4)
    keep = torch.ones(B, N, dtype=torch.bool)
    keep[1, :3] = False
    keep[1, 7] = False
    for form in FORMS:
        out, state = log_linear_attention(q, k, v, g, lam, beta, form=form, chunk_size=4, key_keep_mask=keep)
        real = keep[1].nonzero()[:, 0]
        # row 1 alone, its real tokens only, each weighted by the lambdas it had
        alone, alone_state = log_linear_attention(*(t[1:, :, real] for t in (q, k, v, g, lam, beta)), form=form,
                                                  chunk_size=4)
        torch.testing.assert_close(out[1:, :, real], alone, **TOL)
        torch.testing.assert_close(state[1:], alone_state[:, :, :state.shape[2]], **TOL)


def test_errors_name_the_argument():
    q, k, v, g, lam, beta = problem(5)
    with pytest.raises(ShapeError, match=r"level_weights must have shape \(B, H, L, G\)"):
        log_linear_attention(q, k, v, g, lam[..., 0], beta)
    with pytest.raises(UnsupportedFeature, match="give G >= 5"):
        log_linear_attention(q, k, v, g, lam[..., :3], beta)
    with pytest.raises(UnsupportedFeature, match="give G >= 7"):
        log_linear_attention(q, k, v, g, lam, beta, offset=20)
    with pytest.raises(ShapeError, match="initial_state must have shape"):
        log_linear_attention(q, k, v, g, lam, beta, initial_state=torch.zeros(B, H, DK, DV, dtype=torch.float64))


def test_equals_flash_linear_attentions_reference():
    naive = pytest.importorskip("fla.ops.log_linear_attn.naive")  # test-only oracle (Mamba-2 form), in float64
    q, k, v, g, lam, _ = problem(6, n=8)
    theirs = naive.naive_log_linear_attn(*(t.transpose(1, 2) for t in (q, k, v, g, lam)), scale=DK ** -0.5)
    ours, _ = log_linear_attention(q, k, v, g, lam)
    torch.testing.assert_close(ours, theirs.transpose(1, 2), **TOL)
