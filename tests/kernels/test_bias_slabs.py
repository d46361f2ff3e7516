"""kernels/bias_slabs.py: gradients through torch's fused backward, which rebuilds the weights from the lse.

A row whose bias is ``finfo.min`` everywhere (a "mask" written as a bias) has scores ``finfo.min``:
its weights are uniform, but an lse rounded to ``finfo.min`` loses ``log(Lk)`` and the fused backward
would rebuild weights 1 instead of ``1/Lk``. The path refuses such biases; the chunked backend then
runs its online softmax, whose gradients follow the definition.
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.functional.validate import validate
from attnkit.kernels import bias_slabs
from tests.fuzz.masked_softmax import attend
from tests.helpers import rand_qkv
from tests.oracle import dense_attention

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-8, atol=1e-10)}
# float32 adds a bias of 1e6 with an error of 0.03 (its ulp) before any kernel runs: only finfo.min rows
# (every score exactly finfo.min, uniform weights) are exact in float32; float64 resolves 1e6 + s as well.
CASES = [(torch.float32, torch.finfo(torch.float32).min)] + [
    (torch.float64, value) for value in (torch.finfo(torch.float32).min, -1e6, 1e6)]


def _grads(out, inputs, seed=5):
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(out.dtype)
    return torch.autograd.grad((out * weight).sum(), inputs)


@pytest.mark.parametrize(("dtype", "row_value"), CASES)
def test_a_bias_row_far_from_zero_gives_the_definitions_gradients(dtype, row_value):
    q, k, v = rand_qkv(1, 1, 16, 16, 4, dtype=dtype, seed=1, requires_grad=True)
    bias = torch.zeros(16, 16, dtype=dtype)
    bias[0] = row_value
    bias[3, :5] = row_value  # a row whose largest entry stays 0: the kernel's lse is exact there
    out = attnkit.attention(q, k, v, bias=bias, backend="chunked")
    exact, _ = attend(q, k, v, bias=bias)
    torch.testing.assert_close(out.double(), exact, **TOL[dtype])
    for got, want in zip(_grads(out, (q, k, v)), _grads(exact, (q, k, v)), strict=True):
        torch.testing.assert_close(got.double(), want.double(), **TOL[dtype])


def test_the_path_refuses_only_rows_its_lse_cannot_resolve():
    q, k, v = rand_qkv(1, 2, 8, 8, 4, seed=2)
    ok = torch.zeros(8, 8)
    ok[2, :7] = torch.finfo(torch.float32).min  # partial rows: the row max is 0
    ok[4] = float("-inf")  # a row with no allowed key is exact
    ok[5] = -2000.0  # within 2048 of 0
    assert bias_slabs.refusal(validate(q, k, v, bias=ok)) is None
    for value in (torch.finfo(torch.float32).min, -3000.0, 3000.0, float("nan"), float("inf")):
        bad = ok.clone()
        bad[6] = value
        assert "lse" in bias_slabs.refusal(validate(q, k, v, bias=bad)), value
    assert bias_slabs.refusal(validate(q.double(), k.double(), v.double(), bias=(ok + 3000.0).double())) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_mask_leaving_a_row_only_finfo_min_bias_entries_keeps_exact_gradients(dtype):
    """The row's largest allowed entry is finfo.min even though its unmasked maximum is 0: the kernel's lse
    could not hold it, so bias-slabs must not run (gradients were off by O(10))."""
    q, k, v = rand_qkv(2, 3, 160, 160, 8, dtype=dtype, seed=3, requires_grad=True)
    bias = torch.zeros(160, 160, dtype=dtype)
    bias[:, 80:] = torch.finfo(dtype).min  # "masking" written as a bias, on the keys the window leaves some rows
    mask = masks.sliding_window(10, 0)
    assert attnkit.explain(q.detach(), k.detach(), v.detach(), bias=bias, mask=mask).path != "bias-slabs"
    assert attnkit.explain(q.detach(), k.detach(), v.detach(), bias=bias.clamp(min=-1e3)).path == "bias-slabs"
    out = attnkit.attention(q, k, v, bias=bias, mask=mask)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    got = torch.autograd.grad((out * g).sum(), (q, k, v))
    exact = dense_attention(q, k, v, bias=bias, mask=mask, differentiable=True)
    want = torch.autograd.grad((exact * g.double()).sum(), (q, k, v))
    tol = 1e-9 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(out.double(), exact, rtol=tol, atol=tol)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol)
