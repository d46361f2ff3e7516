"""The fuzzer's check: one :class:`~tests.fuzz.cases.Case` on every backend against the float64 oracles.

Softmax and sigmoid calls are compared with :mod:`tests.fuzz.masked_softmax` (forward, lse,
gradients, of the sinks too, and second derivatives of a gradient penalty, by autograd in float64); sparsemax and
hard, and returned weights, with the dense oracle of :mod:`tests.oracle` (forward only). Every
backend runs: ``auto`` must answer; a forced backend either answers within tolerance or raises
:class:`~attnkit.errors.BackendError`, nothing else. Tolerances scale with the size of the exact
answer: ``|got - exact| <= tol * (1 + max |exact|)``.
"""

from __future__ import annotations

import math

import torch

import attnkit
from attnkit.errors import BackendError
from tests.fuzz.cases import Case
from tests.fuzz.masked_softmax import NORMALIZERS, _allowed, as_4d, attend
from tests.helpers import BACKENDS
from tests.oracle import dense_attention

OUT_TOL = {torch.float64: 1e-9, torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}
GRAD_TOL = {torch.float64: 1e-8, torch.float32: 1e-4, torch.bfloat16: 5e-2, torch.float16: 1e-2}
PLAIN_FACTOR = 3.0  # DESIGN.md: at most 3x the plain same-dtype implementation's error (gradients)


def lse_accumulation(case: Case) -> float:
    """The rounding an lse may carry from summing ``Lk`` terms one key block at a time, beyond the plain run's.

    The lse is float32 for every input dtype but float64 (the row sums run in float32 at least), so its
    unit roundoff ``u`` is float32's (2^-24; float64's for float64 calls). With ``m`` the row's max,
    ``lse = m + log S`` and ``S = sum_j exp(s_j - m) >= 1``. A path that adds the ``n = Lk`` terms one
    after another (the online softmax, block by block) computes ``S (1 + e)`` with
    ``|e| <= (n - 1) u + n u + ceil(n / block) u <= (2 n + 1) u`` to first order: recursive summation of
    positive terms (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., eq. 4.4), one rounding
    per ``exp``, one per rescaling of the running sum. ``log`` turns that relative error into an absolute
    one on the lse: ``|d lse| <= |e| (1 + O(u))``. The plain float32 run (torch's ``logsumexp``, pairwise
    sums) does not show this term, and the score rounding (``(D + 2) u max |s|``) it does show is the
    ``3 x plain`` part of the bound. At 1000 keys this is 2001 u = 1.2e-4: a float32 lse 5e-5 off at
    ``|lse| ~ 7`` with 513-1000 keys (the chunked path with a relative-position bias, in bfloat16)
    is within it, and within the contract.
    """
    u = 2.0 ** -53 if case.dtype == torch.float64 else 2.0 ** -24
    return (2 * case.lk + 1) * u


def _max_err(got, exact):
    finite = torch.isfinite(exact)
    return (got.double()[finite] - exact.double()[finite]).abs().max().item() if finite.any() else 0.0


def _close(what, got, exact, tol, plain=None, extra=0.0, nan="none", hit=None):
    """``|got - exact| <= tol (1 + max |exact|) + 3 |plain - exact| + extra``, infinities equal, and NaN: none
    (``nan="none"``, finite inputs), exactly the oracle's (``"same"``), or at least the oracle's on the keys ``hit``
    (bool, broadcast to ``got``), the entries finite in both equal (``"more"``: the key and value gradients of
    infinite inputs, row 21)."""
    assert got.shape == exact.shape, f"{what}: shape {tuple(got.shape)} != {tuple(exact.shape)}"
    got, exact = got.double(), exact.double()
    if nan == "more":
        assert got.isnan()[exact.isnan() & hit].all(), f"{what}: finite where the oracle has NaN"
        kept = ~got.isnan() & ~exact.isnan()
        got, exact, plain = got[kept], exact[kept], None if plain is None else plain.double()[kept]
    elif nan == "same":
        assert torch.equal(got.isnan(), exact.isnan()), f"{what}: NaN where the oracle has none, or none where it has"
    else:
        assert not torch.isnan(got).any(), f"{what}: NaN for finite inputs"
    same_inf = torch.equal(torch.isinf(got), torch.isinf(exact)) and torch.equal(got[torch.isinf(got)],
                                                                                  exact[torch.isinf(exact)])
    assert same_inf, f"{what}: infinities differ"
    finite = torch.isfinite(exact)
    err = _max_err(got, exact)
    bound = tol * (1.0 + (exact[finite].abs().max().item() if finite.any() else 0.0)) + extra
    plain_err = _max_err(plain, exact) if plain is not None else 0.0
    if math.isfinite(plain_err):  # a plain float32 run that overflows (finfo.min scores) sets no bound
        bound += PLAIN_FACTOR * plain_err
    assert err <= bound, f"{what}: error {err:.3g} > {bound:.3g}"


def _keys_a_nan_row_allows(case: Case, exact) -> torch.Tensor:
    """Bool ``(..., Lk, 1)`` in the key gradients' shape: the keys a NaN row of ``exact`` allows (RELIABILITY finding
    39: their dk, dv are NaN). The oracle's are NaN on more keys: its products run through the masked pairs too,
    ``0 * inf`` with an infinite query, which the paths that skip masked blocks never form."""
    batch, heads = (case.batch, case.heads) if case.rank == 4 else (case.batch if case.rank == 3 else 1, 1)
    allowed = _allowed(case.mask, (*exact.shape[:-1], case.lk), batch, heads, case.lq, case.lk)
    rows = as_4d(exact).isnan().any(-1)  # (B, H, Lq)
    hit = (allowed & rows[..., None]).any(-2)  # (B, H, Lk)
    kv_heads = case.kv_heads if case.rank == 4 else 1
    hit = hit.view(batch, kv_heads, heads // kv_heads, case.lk).any(2)[..., None]  # query head h: kv head h // g
    return hit if case.rank == 4 else hit[:, 0] if case.rank == 3 else hit[0, 0]


def _rows_the_mask_empties(where, dq, exact_dq, exact, exact_lse):
    """``dq`` and the oracle's, 0 on the rows the mask empties (lse ``-inf``, output not NaN), where ``dq`` must be
    0 or NaN: RELIABILITY finding 39, the infinite feature there is ``0 * inf`` (NaN) unless the mask is key
    padding (row 22: the padded keys are zeroed, so row 1's 0); the float64 oracle multiplies through every key."""
    empty = ((exact_lse == -math.inf) & ~exact.isnan().any(-1))[..., None]
    assert ((dq == 0) | dq.isnan() | ~empty).all(), f"{where}: dq: a row the mask empties is neither 0 nor NaN"
    return dq.masked_fill(empty, 0.0), exact_dq.masked_fill(empty, 0.0)


def _exact(case: Case, q, k, v, bias, sinks, dtype=torch.float64):
    """``(out, lse, differentiable)`` in ``dtype``, from the masked-softmax oracle where it applies."""
    kwargs = dict(mask=case.mask, bias=bias, score=case.score, scale=case.scale, normalize=case.normalize)
    if case.normalize in NORMALIZERS:
        out, lse = attend(q, k, v, dtype=dtype, sinks=sinks, **kwargs)
        return out, lse, True
    return dense_attention(q, k, v, dtype=dtype, **kwargs), None, False


def _grad_inputs(*tensors):
    named = zip(("dq", "dk", "dv", "dbias", "dsinks"), tensors, strict=True)
    return [(n, t) for n, t in named if isinstance(t, torch.Tensor) and t.requires_grad]


def _grads(out, probe, inputs):
    grads = torch.autograd.grad((out * probe.to(out.dtype)).sum(), inputs, allow_unused=True, retain_graph=True)
    return [torch.zeros_like(t, dtype=torch.float64) if g is None else g for g, t in zip(grads, inputs, strict=True)]


def _penalty_grads(out, probe, inputs):
    """Gradients of ``sum(dq^2)`` with ``dq = d <out, probe> / dq`` (create_graph): second derivatives."""
    (dq,) = torch.autograd.grad((out * probe.to(out.dtype)).sum(), inputs[0], create_graph=True)
    grads = torch.autograd.grad(dq.square().sum(), inputs, allow_unused=True) if dq.requires_grad else [None] * len(
        inputs)
    return [torch.zeros_like(t, dtype=torch.float64) if g is None else g for g, t in zip(grads, inputs, strict=True)]


def check(case: Case) -> list[str]:
    """Run ``case`` on every backend; raise AssertionError naming the backend on any mismatch.

    Returns the paths that ran (for the caller's statistics).
    """
    q, k, v, bias = case.tensors()
    sinks = case.sink_tensor()
    exact, exact_lse, differentiable = _exact(case, q, k, v, bias, sinks)
    plain, plain_lse = (None, None) if case.dtype == torch.float64 else _exact(case, q, k, v, bias, sinks,
                                                                                 torch.float32)[:2]
    weights = None
    if case.return_weights:
        weights = dense_attention(q, k, v, **{**case.kwargs(bias, sinks), "return_lse": False}).weights
    named = _grad_inputs(q, k, v, bias, sinks)
    names, inputs = [n for n, _ in named], [t for _, t in named]
    # infinite inputs: the gradients of row 21's oracle (no bias, modifier or sink); beside one, where -inf reads as
    # masking (rows 6 and 51), which products meet 0 * inf depends on the formula: the forward alone is compared
    bare = case.infinite is None or (bias is None and sinks is None)
    want_grads = bool(case.grad and differentiable and inputs and exact.numel() and bare)
    if want_grads:
        probe = torch.randn(exact.shape, generator=torch.Generator().manual_seed(case.seed + 1), dtype=torch.float64)
        exact_grads = _grads(exact, probe, inputs)
        plain_grads = [None] * len(inputs) if plain is None else _grads(plain, probe, inputs)
        second = case.second_order and inputs[0] is q
        if second:
            exact_second = _penalty_grads(exact, probe, inputs)
            plain_second = [None] * len(inputs) if plain is None else _penalty_grads(plain, probe, inputs)
    hit = _keys_a_nan_row_allows(case, exact) if want_grads and case.infinite is not None else None
    ran = []
    for backend in ("auto", *BACKENDS):
        try:
            res = attnkit.attention(q, k, v, backend=backend, **case.kwargs(bias, sinks))
        except BackendError:
            assert backend != "auto", "backend='auto' raised BackendError"
            continue
        ran.append(attnkit.explain(q, k, v, backend=backend, **case.kwargs(bias, sinks)).path)
        out = res.output if isinstance(res, tuple) else res
        where = f"backend={backend} ({ran[-1]})"
        assert out.dtype == q.dtype, f"{where}: output dtype {out.dtype}"
        nan = "none" if case.infinite is None else "same"  # row 21: NaN rows where the oracle's are
        _close(f"{where}: output", out, exact, OUT_TOL[case.dtype], plain, nan=nan)
        if case.return_lse:
            _close(f"{where}: lse", res.lse, exact_lse, OUT_TOL[case.dtype], plain_lse, lse_accumulation(case))
        if case.return_weights:
            _close(f"{where}: weights", res.weights, weights, OUT_TOL[case.dtype])
        if want_grads:
            for name, g, e, p in zip(names, _grads(out, probe, inputs), exact_grads, plain_grads, strict=True):
                if name == "dq" and nan == "same":
                    g, e = _rows_the_mask_empties(where, g, e, exact, exact_lse)
                # dq as the oracle's, NaN included; dk, dv NaN on the keys a NaN row allows, maybe on more
                _close(f"{where}: {name}", g, e, GRAD_TOL[case.dtype], p, nan=nan if name == "dq" else
                       "more" if nan == "same" else "none", hit=None if nan == "none" else hit)
        if want_grads and second:
            again = attnkit.attention(q, k, v, backend=backend, **case.kwargs(bias, sinks))
            again = again.output if isinstance(again, tuple) else again
            for name, g, e, p in zip(names, _penalty_grads(again, probe, inputs), exact_second, plain_second,
                                     strict=True):
                name = f"d2{name[1:]}"
                _close(f"{where}: {name} (second order)", g, e, GRAD_TOL[case.dtype], p)
    return ran
