"""RWKV-7's generalized delta rule against a float64 transcription (Peng et al. 2025, arXiv:2503.14456, eq. 14),
in every form, forward and backward, decoding token by token, packed documents, and fla's reference."""

import pytest
import torch
import torch.nn.functional as F

from attnkit.errors import ShapeError
from attnkit.functional.recurrences import FORMS, generalized_delta_rule

TOL = dict(rtol=0, atol=1e-10)
B, H, N, DK, DV = 2, 3, 11, 5, 4


def oracle(q, k, v, g, a, b, state, scale=1.0):
    """S_t = (diag(w_t) + b_t a_t^T) S_{t-1} + k_t v_t^T, w = exp(g); o_t = S_t^T q_t; explicit float64 matrices."""
    s, out = state.double().clone(), []
    for t in range(q.shape[2]):
        transition = torch.diag_embed(g[:, :, t].double().exp()) + b[:, :, t, :, None].double() * a[:, :, t, None,
                                                                                                       :].double()
        s = transition @ s + k[:, :, t, :, None].double() * v[:, :, t, None, :].double()
        out.append((q[:, :, t, None, :].double() * scale @ s)[:, :, 0])
    return torch.stack(out, 2), s


def problem(seed=0, b=B, n=N):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)
    q, k, v, kappa = rnd(b, H, n, DK), rnd(b, H, n, DK), rnd(b, H, n, DV), F.normalize(rnd(b, H, n, DK), dim=-1)
    g = -0.6065 * torch.sigmoid(rnd(b, H, n, DK))  # RWKV-7's decay range, w in (0.545, 1)
    a, bb = -kappa, kappa * torch.sigmoid(rnd(b, H, n, DK))  # removal key and in-context learning rate
    return [t.requires_grad_() for t in (q, k, v, g, a, bb, rnd(b, H, DK, DV))]


@pytest.mark.parametrize("form", FORMS)
def test_every_form_equals_the_papers_update(form):
    q, k, v, g, a, b, s0 = problem()
    out, state = generalized_delta_rule(q, k, v, g, a, b, form=form, chunk_size=4, initial_state=s0)
    want_out, want_state = oracle(*(t.detach() for t in (q, k, v, g, a, b, s0)))
    torch.testing.assert_close(out, want_out, **TOL)
    torch.testing.assert_close(state, want_state, **TOL)


def test_a_free_rank_one_term_and_strong_decays_in_every_form():
    q, k, v, _, _, _, s0 = (t.detach() for t in problem(6))
    gen = torch.Generator().manual_seed(7)
    g = -3 * torch.rand(B, H, N, DK, generator=gen, dtype=torch.float64)  # decays down to e^-3 per step
    a, b = (0.4 * torch.randn(B, H, N, DK, generator=gen, dtype=torch.float64) for _ in range(2))
    want = oracle(q, k, v, g, a, b, s0)
    for form in FORMS:
        got = generalized_delta_rule(q, k, v, g, a, b, form=form, chunk_size=3, initial_state=s0)
        for x, e in zip(got, want, strict=True):
            torch.testing.assert_close(x, e, **TOL)


def test_gradients_agree_across_forms():
    leaves = problem(1)
    w = torch.randn(B, H, N, DV, dtype=torch.float64)
    grads = []
    for form in FORMS:
        out, state = generalized_delta_rule(*leaves[:6], form=form, chunk_size=3, initial_state=leaves[6])
        grads.append(torch.autograd.grad((out * w).sum() + state.sum(), leaves))
    for other in grads[1:]:
        for x, e in zip(grads[0], other, strict=True):
            torch.testing.assert_close(e, x, **TOL)


def test_decoding_token_by_token_equals_the_prefill():
    q, k, v, g, a, b, s0 = (t.detach() for t in problem(2))
    full, final = generalized_delta_rule(q, k, v, g, a, b, initial_state=s0)
    state, outs = s0, []
    for t in range(N):
        out, state = generalized_delta_rule(*(x[:, :, t:t + 1] for x in (q, k, v, g, a, b)), form="recurrent",
                                            initial_state=state)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, 2), full, **TOL)
    torch.testing.assert_close(state, final, **TOL)


def test_packed_documents_each_start_from_their_own_state():
    q, k, v, g, a, b, _ = (t.detach() for t in problem(3, b=1))
    packed, states = generalized_delta_rule(q, k, v, g, a, b, cu_seqlens=torch.tensor([0, 5, 11]), chunk_size=4)
    alone, state = generalized_delta_rule(*(x[:, :, 5:] for x in (q, k, v, g, a, b)), form="parallel")
    torch.testing.assert_close(packed[:, :, 5:], alone, **TOL)
    torch.testing.assert_close(states[1:], state, **TOL)


def test_shapes_are_checked():
    q, k, v, g, a, b, _ = problem()
    with pytest.raises(ShapeError, match=r"a must have shape \(B, H, L, Dk\) = \(2, 3, 11, 5\); got \(2, 3, 11, 4\)"):
        generalized_delta_rule(q, k, v, g, a[..., :4], b)


def test_equals_flash_linear_attentions_reference():
    naive = pytest.importorskip("fla.ops.generalized_delta_rule.dplr.naive")  # test-only oracle, float32
    q, k, v, g, a, b, s0 = (t.detach() for t in problem(5))
    theirs, state = naive.dplr_recurrence(*(t.float() for t in (q, k, v, a, b, g)), initial_state=s0.float())
    out, final = generalized_delta_rule(q, k, v, g, a, b, scale=DK ** -0.5, initial_state=s0)
    torch.testing.assert_close(out, theirs.double(), rtol=0, atol=1e-4)
    torch.testing.assert_close(final, state.double(), rtol=0, atol=1e-4)
