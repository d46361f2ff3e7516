"""The delta rule: beta = 0 keeps the state, beta = 1 with a unit key replaces what that key recalls."""

import pytest
import torch

from attnkit.errors import ShapeError
from attnkit.functional.recurrences import FORMS, delta_rule

from .cases import qkv

TOL = dict(rtol=0, atol=1e-10)


@pytest.mark.parametrize("form", FORMS)
def test_zero_beta_leaves_the_state_unchanged(form):
    q, k, v = qkv(n=9)
    s0 = torch.randn(2, 3, 5, 7, dtype=torch.float64)
    out, state = delta_rule(q, k, v, torch.zeros(2, 3, 9, dtype=torch.float64), initial_state=s0, form=form,
                            chunk_size=4)
    torch.testing.assert_close(state, s0, **TOL)
    torch.testing.assert_close(out, q * 5 ** -0.5 @ s0, **TOL)


@pytest.mark.parametrize("form", FORMS)
def test_a_full_write_replaces_what_the_key_recalls(form):
    q, k, v = qkv(1, n=9)
    k = k / k.norm(dim=-1, keepdim=True)
    beta = torch.ones(2, 3, 9, dtype=torch.float64)
    _, state = delta_rule(q, k, v, beta, form=form, chunk_size=4)
    recalled = (k[:, :, -1:] @ state)  # the last write wins for its key: S^T k = v
    torch.testing.assert_close(recalled, v[:, :, -1:], **TOL)


def test_beta_shape_is_checked():
    q, k, v = qkv(n=9)
    with pytest.raises(ShapeError, match=r"beta must have shape \(B, H, L\) = \(2, 3, 9\); got \(2, 9, 3\)"):
        delta_rule(q, k, v, torch.zeros(2, 9, 3))


def _parity_inputs(bits, beta_of_one: float):
    """The delta rule as a parity automaton on a one-dimensional state (Dk = Dv = 1), weights set by hand.

    Token 0 (start): k = 1, v = 1, beta = 1 writes S = 1. Each bit x: k = 1, v = 0, beta = beta_of_one x, so
    ``S <- (1 - beta) S``: with beta = 2 a 1 flips the sign (the reflection I - 2 k k^T), a 0 keeps it.
    The read-out q = 1 gives o_t = S_t = (-1)^(number of ones so far).
    """
    n = len(bits) + 1
    ones = torch.ones(1, 1, n, 1, dtype=torch.float64)
    v = torch.zeros(1, 1, n, 1, dtype=torch.float64)
    v[0, 0, 0, 0] = 1.0
    beta = torch.tensor([[[1.0] + [beta_of_one * b for b in bits]]], dtype=torch.float64)
    return ones, ones, v, beta


@pytest.mark.parametrize("form", FORMS)
def test_beta_up_to_two_tracks_parity_exactly(form):
    bits = torch.randint(0, 2, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    out, _ = delta_rule(*_parity_inputs(bits, 2.0), scale=1.0, form=form, chunk_size=8)
    parity = torch.tensor(bits).cumsum(0) % 2
    assert torch.equal(out[0, 0, 1:, 0], 1.0 - 2.0 * parity.double())  # exactly +-1, no rounding at all


def test_beta_in_zero_one_cannot_flip_a_sign():
    # The bound: with |k| = 1 the transition I - beta k k^T has eigenvalues 1 (on k's complement) and 1 - beta,
    # all in [0, 1] when 0 <= beta <= 1, so no product of them flips a sign; beta in [0, 2] reaches -1.
    g = torch.Generator().manual_seed(1)
    k = torch.randn(200, 4, generator=g, dtype=torch.float64)
    k = k / k.norm(dim=-1, keepdim=True)
    beta = torch.linspace(0, 1, 200, dtype=torch.float64)
    transition = torch.eye(4, dtype=torch.float64) - beta[:, None, None] * k[:, :, None] * k[:, None, :]
    eig = torch.linalg.eigvalsh(transition)
    assert eig.min() >= -1e-12 and eig.max() <= 1 + 1e-12
    torch.testing.assert_close(eig[:, 0], 1 - beta, rtol=0, atol=1e-12)
    # On the automaton: after the start token S = 1; one 1-bit must make S negative (parity 1), but for
    # every beta in [0, 1] the state stays >= 0 and the read-out cannot tell parity 1 from parity 0.
    for b in torch.linspace(0, 1, 21).tolist():
        out, _ = delta_rule(*_parity_inputs([1, 1, 0, 1], b), scale=1.0, form="recurrent")
        assert (out[0, 0, 1:, 0] >= 0).all()
        assert not torch.equal(out[0, 0, 1:, 0].sign(), torch.tensor([-1.0, 1.0, 1.0, -1.0], dtype=torch.float64))
