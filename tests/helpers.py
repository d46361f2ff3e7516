"""Shared test helpers: inputs with distinct sizes, the float64 oracle, the tolerance rule."""

from __future__ import annotations

import torch

import attnkit

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


def oracle(q, k, v, **kwargs):
    """The float64 reference answer for the same call."""
    q64, k64, v64 = (t.detach().double() for t in (q, k, v))
    bias = kwargs.get("bias")
    if isinstance(bias, torch.Tensor):
        kwargs = {**kwargs, "bias": bias.double()}
    return attnkit.attention(q64, k64, v64, backend="reference", **kwargs)


def assert_close_to_oracle(got, q, k, v, *, factor=2.0, cap=None, **kwargs):
    """DESIGN.md tolerance rule: error vs float64 <= factor x the plain same-dtype reference's error.

    ``got`` is the kernel's output; the plain implementation is the reference kernel
    at the input dtype. A small absolute floor covers the case where both are exact.
    """
    exact = oracle(q, k, v, **kwargs)
    plain = attnkit.attention(q.detach(), k.detach(), v.detach(), backend="reference", **kwargs)
    err = (got.double() - exact).abs().nan_to_num(0).max().item() if got.numel() else 0.0
    base = (plain.double() - exact).abs().nan_to_num(0).max().item() if got.numel() else 0.0
    floor = 8 * torch.finfo(q.dtype).eps
    assert err <= factor * base + floor, f"error {err:.3g} > {factor} x plain error {base:.3g} (+{floor:.1g})"
    if cap is not None:
        assert err <= cap, f"error {err:.3g} above cap {cap}"
    return err
