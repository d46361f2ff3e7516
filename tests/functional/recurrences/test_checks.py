"""Errors of the linear recurrences (the checks in forms.py) name the argument, what was expected and what came."""

import re

import pytest
import torch

from attnkit.errors import ArgumentError, DeviceError, DTypeError, ShapeError, check_int
from attnkit.functional.recurrences import gated_delta_rule

Q = torch.randn(2, 3, 5, 4)
V = torch.randn(2, 3, 5, 6)
G, BETA = torch.zeros(2, 3, 5), torch.ones(2, 3, 5)


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"form": "fused"}, ArgumentError, r"form must be one of \('parallel', 'chunk', 'recurrent'\); got 'fused'"),
    ({"chunk_size": 0}, ArgumentError, "chunk_size must be an int >= 1; got 0"),
    ({"initial_state": torch.zeros(2, 3, 6, 4)}, ShapeError,
     r"initial_state must have shape \(N, H, Dk, Dv\) = \(2, 3, 4, 6\); got \(2, 3, 6, 4\)"),
    ({"cu_seqlens": torch.tensor([0, 5])}, ShapeError, "packed documents .* need batch 1"),
])
def test_options_are_checked(kwargs, error, message):
    with pytest.raises(error, match=message):
        gated_delta_rule(Q, Q, V, G, BETA, **kwargs)


@pytest.mark.parametrize("bad", [0, -3, 2.0, True])
def test_a_bad_chunk_size_gets_the_shared_int_checks_error(bad):
    """check_form refuses chunk_size with errors.check_int: the same type and wording as every int argument."""
    with pytest.raises(ArgumentError) as shared:
        check_int("gated_delta_rule", "chunk_size", bad, 1)
    wording = str(shared.value).removeprefix("gated_delta_rule: ")
    for form in ("chunk", "parallel"):
        with pytest.raises(ArgumentError, match=re.escape(wording) + "$"):
            gated_delta_rule(Q, Q, V, G, BETA, form=form, chunk_size=bad)


def test_tensors_are_checked():
    with pytest.raises(DTypeError, match=r"k must have q's dtype torch.float32; got torch.float64"):
        gated_delta_rule(Q, Q.double(), V, G, BETA)
    with pytest.raises(ShapeError, match=r"v must have shape \(B, H, L, Dv\) = \(2, a multiple of 3, 5, Dv\)"):
        gated_delta_rule(Q, Q, torch.randn(2, 4, 5, 6), G, BETA)
    with pytest.raises(DTypeError, match=r"q must be a floating tensor; got torch.int64"):
        gated_delta_rule(Q.long(), Q, V, G, BETA)
    with pytest.raises(ShapeError, match=r"q must have shape \(B, H, L, D\); got \(3, 5, 4\)"):
        gated_delta_rule(Q[0], Q[0], V[0], G, BETA)
    with pytest.raises(DeviceError, match="g must be on cpu; got meta"):
        gated_delta_rule(Q, Q, V, G.to("meta"), BETA)


def test_packed_boundaries_are_checked():
    one = lambda t: t[:1]
    with pytest.raises(DTypeError, match=r"cu_seqlens must be an int32 or int64 tensor; got torch.float32"):
        gated_delta_rule(*map(one, (Q, Q, V, G, BETA)), cu_seqlens=torch.tensor([0.0, 5.0]))
    with pytest.raises(ArgumentError, match=r"rise from 0 to the length T = 5 without falling; got \[0, 3, 2, 5\]"):
        gated_delta_rule(*map(one, (Q, Q, V, G, BETA)), cu_seqlens=torch.tensor([0, 3, 2, 5]))
    with pytest.raises(ShapeError, match=r"cu_seqlens must have shape \(N \+ 1,\)"):
        gated_delta_rule(*map(one, (Q, Q, V, G, BETA)), cu_seqlens=torch.tensor([5]))
