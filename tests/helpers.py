"""Shared test helpers: inputs with distinct sizes, the float64 oracle, the tolerance rule."""

from __future__ import annotations

import torch

import attnkit
from tests.oracle import dense_attention

BACKENDS = ("reference", "chunked", "sdpa", "blocksparse")


def rand_qkv(b=2, h=3, lq=5, lk=7, d=11, dv=None, *, hkv=None, dtype=torch.float32, seed=0, requires_grad=False):
    """Random q, k, v with distinct sizes so swapped axes fail loudly."""
    g = torch.Generator().manual_seed(seed)
    hkv = h if hkv is None else hkv
    dv = d if dv is None else dv
    q = torch.randn(b, h, lq, d, generator=g, dtype=torch.float64).to(dtype)
    k = torch.randn(b, hkv, lk, d, generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(b, hkv, lk, dv, generator=g, dtype=torch.float64).to(dtype)
    return tuple(t.requires_grad_(requires_grad) for t in (q, k, v))


def on_device(p, device_type: str):
    """The problem ``p`` decided as if its tensors lived on ``device_type`` (the one fact every device rule reads).

    The data stays where it is, so the rules that read it still run: the dispatcher's decision for a
    CUDA or MPS call can be tested on a machine without one.
    """
    p.memo["device_type"] = device_type
    return p


def oracle(q, k, v, **kwargs):
    """The float64 answer for the same call, from the independent dense attention of tests/oracle.py.

    It shares no code with the kernels under test; tests/test_oracle.py checks it against
    torch's SDPA and the library's reference kernel.
    """
    return dense_attention(q, k, v, **kwargs)


def _max_error(t, exact):
    return (t.double() - exact).abs().nan_to_num(0).max().item() if t.numel() else 0.0


def assert_close_to_oracle(got, q, k, v, *, factor=2.0, cap=None, **kwargs):
    """DESIGN.md tolerance rule: error vs float64 <= factor x the plain same-dtype implementation's error.

    ``got`` is the kernel's output; the float64 answer is :func:`oracle` (independent of the
    library). The plain error is that of the library's reference kernel at the input dtype
    and, below float64, the smaller of it and the independent oracle's at the input dtype
    (float32 math for half inputs, the output rounded once), so the library's own plain path
    cannot loosen the bound alone. (In float64 the oracle *is* the exact answer.) A small
    absolute floor covers the case where both are exact.
    """
    exact = oracle(q, k, v, **kwargs)
    plain = attnkit.attention(q.detach(), k.detach(), v.detach(), backend="reference", **kwargs)
    base = _max_error(plain, exact)
    if q.dtype != torch.float64:
        base = min(base, _max_error(dense_attention(q, k, v, dtype=torch.float32, out_dtype=q.dtype, **kwargs), exact))
    err = _max_error(got, exact)
    floor = 8 * torch.finfo(q.dtype).eps
    assert err <= factor * base + floor, f"error {err:.3g} > {factor} x plain error {base:.3g} (+{floor:.1g})"
    if cap is not None:
        assert err <= cap, f"error {err:.3g} above cap {cap}"
    return err


def randomized_float64(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` in float64 with every parameter random (zero-initialised biases included), seeded."""
    torch.manual_seed(0)
    module = module.to(torch.float64)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.3)
    return module


def assert_close_with_gradients(out, want, leaves, **tol):
    """``out`` equals ``want`` and so do their gradients in every tensor of ``leaves``, under one random
    weighting of the outputs (``torch.testing.assert_close`` with ``tol``)."""
    torch.testing.assert_close(out, want, **tol)
    weights = torch.randn_like(want)
    got = torch.autograd.grad((out * weights).sum(), leaves)
    expected = torch.autograd.grad((want * weights).sum(), leaves)
    for a, e in zip(got, expected, strict=True):
        torch.testing.assert_close(a, e, **tol)
