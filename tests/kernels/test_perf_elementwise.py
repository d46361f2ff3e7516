"""The elementwise rewrite of the soft-capping path (benchmark target 4) computes the float64 reference's function.

``kernels/softcap_loop.py``: ``tanh`` by the cheapest approximant a float32 block's range
admits (polynomials in ``x^2`` up to ``|x| <= 1``, a Pade approximant up to 2),
``torch.tanh`` elsewhere; ``exp2`` of one fused multiply-add for the weights;
``aten.tanh_backward`` in the backward.

The path is held to the DESIGN.md rule: error vs float64 at most 2x (3x for gradients)
the error of the plain float32 implementation (``torch.tanh`` on the same inputs).
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.bias import Softcap
from attnkit.kernels import softcap_grad, softcap_loop
from attnkit.kernels.pipeline import Workspace
from tests.helpers import assert_close_to_oracle, oracle, rand_qkv

B, H, LQ, LK, D = 2, 3, 5, 7, 11


def _rule(got, exact, plain, factor, dtype=torch.float32):
    """DESIGN.md: max error vs float64 <= factor x the plain same-dtype error (+ a rounding floor)."""
    for g, e, p in zip(got, exact, plain, strict=True):
        err, base = (g.double() - e).abs().max().item(), (p.double() - e).abs().max().item()
        floor = 8 * torch.finfo(dtype).eps * max(1.0, e.abs().max().item())
        assert err <= factor * base + floor, (err, base)


# ------------------------------------------------------------------ the Pade tanh


def test_pade_tanh_is_within_a_few_ulp_in_range_and_torch_tanh_outside():
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(2, 3, 64, 128, generator=g, dtype=torch.float64) * 4 - 2).float()  # [-2, 2]
    exact = torch.tanh(x.double())
    got = softcap_loop.tanh_(x.clone(), Workspace(x))
    rel = ((got.double() - exact).abs() / exact.abs().clamp_min(1e-30)).max().item()
    assert rel <= 3 * 2.0 ** -23  # about 2 ulp; torch.tanh is 0.5 ulp
    assert not torch.equal(got, torch.tanh(x))  # the approximant ran, not torch's tanh
    assert torch.equal(softcap_loop.tanh_(x.clone(), Workspace(x), limit=2.0), got)  # no check, same numbers
    x[1, 2, 3, 4] = 2.5  # one value out of range: the whole block is torch's tanh
    assert torch.equal(softcap_loop.tanh_(x.clone(), Workspace(x)), torch.tanh(x))
    xd = x.double()  # float64 is never approximated
    assert torch.equal(softcap_loop.tanh_(xd.clone(), Workspace(xd)), torch.tanh(xd))


def test_pade_tanh_keeps_nan_and_signed_zero():
    x = torch.tensor([[0.0, -0.0, 1e-30, -1.5, 2.0, float("nan")]])
    got = softcap_loop.tanh_(x.clone(), Workspace(x))
    assert torch.isnan(got[0, 5]) and torch.equal(got[0, :5], torch.tanh(x[0, :5]))  # NaN: torch's tanh block
    got = softcap_loop.tanh_(x[:, :5].clone(), Workspace(x))  # in range: the approximant
    assert torch.equal(torch.signbit(got), torch.signbit(x[:, :5])) and got[0, 2] == x[0, 2]
    torch.testing.assert_close(got.double(), torch.tanh(x[:, :5].double()), atol=0, rtol=3 * 2.0 ** -23)


@pytest.mark.parametrize("tier", range(len(softcap_loop.POLYNOMIALS)))
def test_each_polynomial_is_within_three_ulp_of_tanh_on_its_range(tier):
    a, coeffs = softcap_loop.POLYNOMIALS[tier]
    x = torch.linspace(-a, a, 400_001, dtype=torch.float64).float()
    assert softcap_loop.approximant(a) is coeffs and softcap_loop.approximant(x.abs().max().item()) is coeffs
    below = softcap_loop.POLYNOMIALS[tier - 1][0] if tier else 0.0
    assert softcap_loop.approximant(below) is not coeffs or tier == 0  # the cheapest one that holds is chosen
    got = softcap_loop.tanh_(x.clone(), Workspace(x))
    exact = torch.tanh(x.double())
    rel = ((got.double() - exact).abs() / exact.abs().clamp_min(1e-30)).max().item()
    assert rel <= 3 * 2.0 ** -24
    assert torch.equal(torch.signbit(got), torch.signbit(x))


def test_approximants_by_range():
    assert softcap_loop.approximant(0.0) is softcap_loop.POLYNOMIALS[0][1]
    assert softcap_loop.approximant(1.0001) is softcap_loop.PADE
    assert softcap_loop.approximant(2.0001) is None and softcap_loop.approximant(float("nan")) is None
    assert softcap_loop.approximant(0.1, torch.float64) is None
    assert softcap_loop.approximant(0.1, torch.bfloat16) is None


# ------------------------------------------------------------------ soft-capped attention


@pytest.fixture
def small_blocks(monkeypatch):
    """Several head spans, row slabs and key blocks at these sizes, forward and backward (uneven ones too)."""
    monkeypatch.setattr(softcap_loop, "FORWARD_BLOCKS", (2, 3, 2 * 3 * 2))
    monkeypatch.setattr(softcap_grad, "BACKWARD_BLOCKS", (3, 2, 3 * 2 * 4))


@pytest.fixture
def block_ranges(monkeypatch):
    """Records ``(max |x|, approximant)`` of every block :func:`softcap_loop.capped_` computes."""
    seen = []
    original = softcap_loop.capped_

    def spy(x, ws, offset, slope, kind, keep_tanh=False):
        seen.append((x.abs().max().item(), kind))
        return original(x, ws, offset, slope, kind, keep_tanh)
    monkeypatch.setattr(softcap_loop, "capped_", spy)
    return seen


def _limit(kind):
    """The largest ``|x|`` an approximant is used for (0 for torch's tanh, which is used anywhere)."""
    if kind is softcap_loop.PADE:
        return softcap_loop.PADE_LIMIT
    return next((a for a, c in softcap_loop.POLYNOMIALS if c is kind), float("inf"))


def _softcap_grads(q, k, v, backend, **kw):
    """Output, lse and the gradients of ``sum(out * g) + sum(lse * h)`` w.r.t. q, k, v."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    res = attnkit.attention(*leaves, return_lse=True, backend=backend, **kw)
    gen = torch.Generator().manual_seed(5)
    g = torch.randn(res.output.shape, generator=gen, dtype=torch.float64).to(res.output.dtype)
    h = torch.randn(res.lse.shape, generator=gen, dtype=torch.float64).to(res.lse.dtype)
    loss = (res.output * g).sum() + (res.lse.nan_to_num(neginf=0.0) * h).sum()
    return [res.output, res.lse.nan_to_num(neginf=0.0), *torch.autograd.grad(loss, leaves)]


def _check_softcap(q, k, v, **kw):
    got = _softcap_grads(q, k, v, "chunked", **kw)
    exact = _softcap_grads(q.double(), k.double(), v.double(), "reference", **kw)
    plain = _softcap_grads(q, k, v, "reference", **kw)
    _rule(got[:1], exact[:1], plain[:1], 2.0)
    torch.testing.assert_close(got[1].double(), exact[1], atol=2e-6, rtol=1e-6)
    _rule(got[2:], exact[2:], plain[2:], 3.0)
    return got


@pytest.mark.parametrize("mask_name", ["none", "causal", "padding"])
@pytest.mark.parametrize("cap", [50.0, 86.0])  # shift c == 0, and c > 0 (e^86 * 7 keys is near float32's max)
def test_softcap_pade_blocks_match_float64_reference(cap, mask_name, small_blocks, block_ranges):
    q, k, v = rand_qkv(B, H, LQ, LK, D, seed=21)
    q = q * 3  # scores up to about 10: well inside 2 cap, so every block takes the approximant
    mask = {"none": None, "causal": masks.causal(), "padding": masks.padding([4, 0])}[mask_name]
    assert (softcap_loop.shift(cap, LK, torch.float32) > 0) == (cap == 86.0)
    got = _check_softcap(q, k, v, bias=Softcap(cap), mask=mask)
    assert block_ranges and all(kind is not None and m <= _limit(kind) for m, kind in block_ranges)
    assert len(block_ranges) > 4  # several blocks, forward and backward
    if mask_name == "padding":
        assert torch.equal(got[0][1], torch.zeros_like(got[0][1])) and torch.equal(got[2][1], torch.zeros_like(q[1]))


def test_softcap_mixed_blocks_match_float64_reference(small_blocks, block_ranges):
    """Rows 0-1 (one slab) have small scores, rows 2-4 large ones: blocks of both kinds in one call."""
    q, k, v = rand_qkv(B, H, LQ, LK, D, seed=22)
    q = torch.cat([q[:, :, :2] * 0.2, q[:, :, 2:] * 6], 2)
    _check_softcap(q, k, v, bias=Softcap(1.0), mask=masks.causal())
    kinds = [kind for _, kind in block_ranges]
    assert None in kinds and any(kind is not None for kind in kinds)  # measured per block: both kinds in one call
    assert all(m <= _limit(kind) for m, kind in block_ranges)


def test_small_norms_fix_the_cheapest_polynomial_without_measuring_blocks(small_blocks, block_ranges, monkeypatch):
    """Cauchy-Schwarz on the row norms vouches for |x| <= 0.35: no block is measured, all take the cubic."""
    measured = []
    monkeypatch.setattr(softcap_loop, "block_range", lambda x: measured.append(x) or x.abs().max().item())
    q, k, v = rand_qkv(B, H, LQ, LK, D, seed=25)
    _check_softcap(q * 0.5, k * 0.5, v, bias=Softcap(20.0), mask=masks.causal())
    assert not measured and block_ranges and all(kind is softcap_loop.POLYNOMIALS[0][1] for _, kind in block_ranges)
    assert all(m <= softcap_loop.POLYNOMIALS[0][0] for m, _ in block_ranges)


def test_softcap_float64_kernel_equals_the_reference_tightly(small_blocks):
    q, k, v = rand_qkv(B, H, LQ, LK, D, dtype=torch.float64, seed=23)
    got = attnkit.attention(q, k, v, bias=Softcap(50.0), backend="chunked")
    torch.testing.assert_close(got, oracle(q, k, v, bias=Softcap(50.0)), atol=1e-13, rtol=1e-13)


def test_softcap_nan_query_propagates_only_to_its_row(small_blocks, block_ranges):
    q, k, v = rand_qkv(B, H, LQ, LK, D, seed=24)
    q[1, 2, 3, 0] = float("nan")
    got = attnkit.attention(q, k, v, bias=Softcap(50.0), backend="chunked")
    nan = torch.zeros(B, H, LQ, D, dtype=torch.bool)
    nan[1, 2, 3] = True
    assert torch.equal(torch.isnan(got), nan)
    assert_close_to_oracle(got, q, k, v, bias=Softcap(50.0))  # NaN where the reference has NaN, close elsewhere
    assert any(kind is None for _, kind in block_ranges)  # a NaN norm never vouches; a NaN block takes torch's tanh


def test_the_pade_tier_is_within_four_ulp_of_tanh_over_a_dense_sweep_of_its_range():
    # every 1009th float32 in [0, 2] and its negation, and the worst value of a sweep of every 37th: 3.54 ulp at
    # 1.5631, the rounding of the float32 evaluation (Horner's rule, a product and a quotient) on the approximant
    top = torch.tensor(2.0).view(torch.int32).item()
    x = torch.arange(0, top + 1, 1009, dtype=torch.int32).view(torch.float32)
    x = torch.cat([x, torch.tensor([1.5630836486816406, 2.0]), -x])
    got = softcap_loop.capped_(x.clone(), Workspace(x), x.new_zeros(()), 1.0, softcap_loop.PADE, keep_tanh=True)[1]
    exact = torch.tanh(x.double())
    magnitude = exact.abs().float()
    ulp = (torch.nextafter(magnitude, torch.tensor(float("inf"))) - magnitude).double()
    assert ((got.double() - exact).abs() / ulp).max().item() <= 4.0
    assert torch.equal(torch.signbit(got), torch.signbit(x))


@pytest.mark.parametrize("mask", [masks.full(), masks.full() & masks.causal()], ids=["full", "full & causal"])
def test_the_loop_takes_the_full_mask(mask):
    """``backend="chunked"`` with a soft-cap and ``full()`` runs the loop (it indexed the mask's 0-d answer)."""
    q, k, v = rand_qkv(2, 3, 9, 7, 8, hkv=1, dtype=torch.float64, seed=5)
    cap = Softcap(2.0)
    assert attnkit.explain(q, k, v, mask=mask, bias=cap, backend="chunked").path == "softcap-loop"
    got = attnkit.attention(q, k, v, mask=mask, bias=cap, backend="chunked")
    torch.testing.assert_close(got, oracle(q, k, v, mask=mask, bias=cap), rtol=0, atol=1e-12)
