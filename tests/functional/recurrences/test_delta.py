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
