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
from tests.fuzz.masked_softmax import NORMALIZERS, attend
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


def _close(what, got, exact, tol, plain=None, extra=0.0):
    """``|got - exact| <= tol (1 + max |exact|) + 3 |plain - exact| + extra``, infinities equal, no NaN."""
    assert got.shape == exact.shape, f"{what}: shape {tuple(got.shape)} != {tuple(exact.shape)}"
    got, exact = got.double(), exact.double()
    same_inf = torch.equal(torch.isinf(got), torch.isinf(exact)) and torch.equal(got[torch.isinf(got)],
                                                                                  exact[torch.isinf(exact)])
    assert same_inf, f"{what}: infinities differ"
    assert not torch.isnan(got).any(), f"{what}: NaN for finite inputs"
    finite = torch.isfinite(exact)
    err = _max_err(got, exact)
    bound = tol * (1.0 + (exact[finite].abs().max().item() if finite.any() else 0.0)) + extra
    plain_err = _max_err(plain, exact) if plain is not None else 0.0
    if math.isfinite(plain_err):  # a plain float32 run that overflows (finfo.min scores) sets no bound
        bound += PLAIN_FACTOR * plain_err
    assert err <= bound, f"{what}: error {err:.3g} > {bound:.3g}"


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
    want_grads = bool(case.grad and differentiable and inputs and exact.numel())
    if want_grads:
        probe = torch.randn(exact.shape, generator=torch.Generator().manual_seed(case.seed + 1), dtype=torch.float64)
        exact_grads = _grads(exact, probe, inputs)
        plain_grads = [None] * len(inputs) if plain is None else _grads(plain, probe, inputs)
        second = case.second_order and inputs[0] is q
        if second:
            exact_second = _penalty_grads(exact, probe, inputs)
            plain_second = [None] * len(inputs) if plain is None else _penalty_grads(plain, probe, inputs)
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
        _close(f"{where}: output", out, exact, OUT_TOL[case.dtype], plain)
        if case.return_lse:
            _close(f"{where}: lse", res.lse, exact_lse, OUT_TOL[case.dtype], plain_lse, lse_accumulation(case))
        if case.return_weights:
            _close(f"{where}: weights", res.weights, weights, OUT_TOL[case.dtype])
        if want_grads:
            for name, g, e, p in zip(names, _grads(out, probe, inputs), exact_grads, plain_grads, strict=True):
                _close(f"{where}: {name}", g, e, GRAD_TOL[case.dtype], p)
        if want_grads and second:
            again = attnkit.attention(q, k, v, backend=backend, **case.kwargs(bias, sinks))
            again = again.output if isinstance(again, tuple) else again
            for name, g, e, p in zip(names, _penalty_grads(again, probe, inputs), exact_second, plain_second,
                                     strict=True):
                name = f"d2{name[1:]}"
                _close(f"{where}: {name} (second order)", g, e, GRAD_TOL[case.dtype], p)
    return ran
