"""DeltaProduct against a float64 transcription of its equations (Siems et al. 2025, arXiv:2502.10297, eq. 3), in
every form, forward and backward, decoding token by token, packed documents, and fla's reference."""

import pytest
import torch
import torch.nn.functional as F

from attnkit.errors import ArgumentError, ShapeError
from attnkit.functional.recurrences import FORMS, delta_product

from .cases import unit

TOL = dict(rtol=0, atol=1e-10)
B, H, N, NH, DK, DV = 2, 3, 7, 3, 4, 5


def oracle(q, k, v, beta, g, n_h, state):
    """S_{t,0} = alpha_t S_{t-1}; S_{t,i} = (I - beta k k^T) S_{t,i-1} + beta k v^T; o_t = S_t^T q_t (explicit
    float64 matrices, q and k already normalised and scaled)."""
    n, dk = q.shape[2:]
    eye = torch.eye(dk, dtype=torch.float64)
    s, out = state.clone(), []
    for t in range(n):
        s = s * (1.0 if g is None else g[:, :, t].exp()[..., None, None])
        for i in range(t * n_h, (t + 1) * n_h):
            kt, bt = k[:, :, i, :, None], beta[:, :, i, None, None]
            s = (eye - bt * kt @ kt.transpose(-1, -2)) @ s + bt * kt @ v[:, :, i, None, :]
        out.append((q[:, :, t, None, :] @ s)[:, :, 0])
    return torch.stack(out, 2), s


def problem(seed=0, gated=True, n=N):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)
    q, k, v = rnd(B, H, n, DK), rnd(B, H, n * NH, DK), rnd(B, H, n * NH, DV)
    beta = 2 * torch.sigmoid(rnd(B, H, n * NH))  # negative eigenvalues allowed
    g = F.logsigmoid(rnd(B, H, n) + 1) if gated else None
    s0 = rnd(B, H, DK, DV)
    return [t if t is None else t.requires_grad_() for t in (q, k, v, beta, g, s0)]


def expected(q, k, v, beta, g, s0):
    return oracle(unit(q).detach() * DK ** -0.5, unit(k).detach(), v.detach(), beta.detach(),
                  None if g is None else g.detach(), NH, s0.detach())


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("form", FORMS)
def test_every_form_equals_the_papers_equations(form, gated):
    q, k, v, beta, g, s0 = problem(gated=gated)
    out, state = delta_product(q, k, v, beta, g=g, num_householder=NH, normalize_qk=True, form=form, chunk_size=4,
                               initial_state=s0)
    want_out, want_state = expected(q, k, v, beta, g, s0)
    torch.testing.assert_close(out, want_out, **TOL)
    torch.testing.assert_close(state, want_state, **TOL)


def test_gradients_agree_across_forms():
    leaves = [t for t in problem(1) if t is not None]
    q, k, v, beta, g, s0 = leaves
    w = torch.randn(B, H, N, DV, dtype=torch.float64)
    grads = []
    for form in FORMS:
        out, state = delta_product(q, k, v, beta, g=g, num_householder=NH, normalize_qk=True, form=form,
                                   chunk_size=5, initial_state=s0)
        grads.append(torch.autograd.grad((out * w).sum() + state.sum(), leaves))
    for other in grads[1:]:
        for a, e in zip(grads[0], other, strict=True):
            torch.testing.assert_close(e, a, **TOL)


def test_decoding_token_by_token_equals_the_prefill():
    q, k, v, beta, g, s0 = (t.detach() for t in problem(2))
    full, final = delta_product(q, k, v, beta, g=g, num_householder=NH, normalize_qk=True, initial_state=s0)
    state, outs = s0, []
    for t in range(N):
        steps = slice(t * NH, (t + 1) * NH)
        out, state = delta_product(q[:, :, t:t + 1], k[:, :, steps], v[:, :, steps], beta[:, :, steps],
                                   g=g[:, :, t:t + 1], num_householder=NH, normalize_qk=True, form="recurrent",
                                   initial_state=state)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, 2), full, **TOL)
    torch.testing.assert_close(state, final, **TOL)


def test_packed_documents_each_start_from_their_own_state():
    q, k, v, beta, g, _ = (None if t is None else t.detach()[:1] for t in problem(3))
    cu = torch.tensor([0, 3, 7])
    packed, states = delta_product(q, k, v, beta, g=g, num_householder=NH, cu_seqlens=cu, form="chunk", chunk_size=4)
    alone, state = delta_product(q[:, :, 3:], k[:, :, 3 * NH:], v[:, :, 3 * NH:], beta[:, :, 3 * NH:],
                                 g=g[:, :, 3:], num_householder=NH, form="parallel")
    torch.testing.assert_close(packed[:, :, 3:], alone, **TOL)
    torch.testing.assert_close(states[1:], state, **TOL)


def test_one_step_per_token_is_the_gated_delta_rule():
    from attnkit.functional.recurrences import gated_delta_rule
    q, _, _, _, g, s0 = (t.detach() for t in problem(4))
    k, v = torch.randn(B, H, N, DK, dtype=torch.float64), torch.randn(B, H, N, DV, dtype=torch.float64)
    beta = torch.rand(B, H, N, dtype=torch.float64)
    ours = delta_product(q, k, v, beta, g=g, num_householder=1, initial_state=s0)
    theirs = gated_delta_rule(q, k, v, g, beta, initial_state=s0)
    for a, e in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, e, **TOL)


def test_shapes_are_checked():
    q, k, v, beta, _, _ = problem()
    with pytest.raises(ShapeError, match=r"beta must have shape \(B, H, L n_h\) = \(2, 3, 21\); got \(2, 3, 7\)"):
        delta_product(q, k, v, beta[:, :, :N], num_householder=NH)
    with pytest.raises(ShapeError, match=r"k must have the shape of q \(its L n_h steps\) \(2, 3, 14, 4\); got "
                                         r"\(2, 3, 21, 4\)"):
        delta_product(q, k, v, beta, num_householder=2)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "3", None])
def test_num_householder_is_checked_by_the_shared_int_check(bad):
    q, k, v, beta, _, _ = problem()
    with pytest.raises(ArgumentError, match=rf"delta_product: num_householder must be an int >= 1; got {bad!r}"):
        delta_product(q, k, v, beta, num_householder=bad)


def test_equals_flash_linear_attentions_reference():
    naive = pytest.importorskip("fla.ops.gated_delta_product.naive")  # test-only oracle, computes in float32
    q, k, v, beta, g, s0 = (t.detach() for t in problem(5))
    k = unit(k)  # unit keys: the state stays of the inputs' size, float32's rounding small beside it
    theirs, state = naive.naive_recurrent_gated_delta_product(
        *(t.transpose(1, 2) for t in (q, k, v, g, beta)), scale=DK ** -0.5, initial_state=s0.float(),
        output_final_state=True, num_householder=NH)
    out, final = delta_product(q, k, v, beta, g=g, num_householder=NH, initial_state=s0)
    torch.testing.assert_close(out, theirs.transpose(1, 2).double(), rtol=0, atol=1e-4)
    torch.testing.assert_close(final, state.double(), rtol=0, atol=1e-4)
