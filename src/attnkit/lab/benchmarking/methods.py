"""The two sides of a benchmark comparison: attnkit, and what a torch user would write instead.

Each side is a :class:`~.side.Method` (a forward callable and the leaves its backward
fills). Anything a comparison needs once (a dense mask, a dense bias, a compiled kernel)
is built when the method is made, outside timing.

Comparison kinds (``theirs``):

- ``sdpa``: torch SDPA as a user calls it for the same mask without building an
  ``Lq x Lk`` tensor: no mask, ``is_causal=True``, or a ``(B, 1, 1, Lk)`` key mask;
  with a bias it is SDPA *without* the bias (the unmasked throughput reference).
- ``sdpa-mask``: SDPA given the dense bool mask; ``sdpa-bias``: SDPA given the
  dense float bias equal to an additive modifier (masked entries ``-inf``).
- ``eager``: plain torch, ``softmax(modify(q k^T * scale)) v`` with dense scores.
- ``flex``: FlexAttention compiled with ``torch.compile`` (:mod:`.flex`).
- ``fp32``: attnkit itself on float32 copies of the inputs (for bfloat16 rows).
- ``compiled-sdpa-mask``: ``sdpa-mask`` under ``torch.compile(fullgraph=True)``.
- ``attnkit-eager``: attnkit itself, not compiled (for rows whose attnkit side is compiled).

With ``compiled=True`` attnkit's side is ``torch.compile(fullgraph=True)`` of the same
call. Compiled sides are compiled and run once, forward and backward, when built, so
compile time stays out of the timing (it is shown in the row's notes).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...bias import apply_modifier
from ...core import attention, explain
from ..analysis.patterns import dense_bias, make_bias, make_mask
from ..analysis.timing import time_once
from .side import Method, Unavailable

__all__ = ["KINDS", "Method", "Unavailable", "ours", "theirs", "problem"]

KINDS = ("sdpa", "sdpa-mask", "sdpa-bias", "eager", "flex", "fp32", "compiled-sdpa-mask", "attnkit-eager")


def problem(case):
    """``(q, k, v, mask, modifier)`` of a case (same seed, so every side sees the same numbers), on its device."""
    q, k, v = case.inputs()
    modifier = make_bias(case.bias, case.heads)
    if isinstance(modifier, torch.nn.Module):  # a learned table lives where the inputs do
        modifier = modifier.to(q.device)
    return q, k, v, make_mask(case.mask, q.shape[2]), modifier


def ours(case, q, k, v, mask, modifier, backend: str = "auto", compiled: bool = False) -> Method:
    """``attnkit.attention`` with the case's mask and bias on ``backend`` (``compiled``: under torch.compile)."""
    label = f"attnkit {backend}"
    if backend == "auto":
        label = f"attnkit auto -> {explain(q, k, v, mask=mask, bias=modifier).backend}"
    method = Method(label, lambda: attention(q, k, v, mask=mask, bias=modifier, backend=backend), (q, k, v))
    return _compiled(method, "compiled ") if compiled else method


def _compiled(method: Method, prefix: str) -> Method:
    """``method`` under ``torch.compile(fullgraph=True)``, compiled and run once (forward and backward) here."""
    fn = torch.compile(method.fn, fullgraph=True)

    def first_call():
        out = fn()
        if out.requires_grad:
            out.sum().backward()
            for leaf in method.leaves:
                leaf.grad = None

    seconds, _ = time_once(first_call, method.leaves[0].device)
    notes = {**(method.notes or {}), "compile s": round(seconds, 1)}
    return Method(prefix + method.name, fn, method.leaves, notes, method.same)


def _dense_mask(mask, q, k) -> torch.Tensor:
    dense = mask.materialize(q.shape[2], k.shape[2], batch=q.shape[0], device=q.device)  # (B|1, 1, Lq, Lk)
    return dense[0, 0] if dense.shape[0] == 1 else dense


def _sdpa(case, q, k, v, mask, modifier) -> Method:
    suffix, same = (", no bias", False) if modifier is not None else ("", True)
    if mask is None:
        return Method(f"torch sdpa (no mask{suffix})", lambda: F.scaled_dot_product_attention(q, k, v), (q, k, v),
                      same=same)
    if q.shape[2] == k.shape[2] and mask.band(q.shape[2], k.shape[2]) == (None, 0):  # causal, aligned
        return Method(f"torch sdpa (is_causal{suffix})",
                      lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), same=same)
    if mask.key_padding() is mask:  # reads only (b, kv): the (B, 1, 1, Lk) key mask a user passes
        keep = mask.materialize(1, k.shape[2], batch=q.shape[0], device=q.device)
        return Method(f"torch sdpa (key mask{suffix})",
                      lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=keep), (q, k, v), same=same)
    raise Unavailable(f"SDPA takes {case.mask} only as a dense mask (compare sdpa-mask)")


def _sdpa_mask(case, q, k, v, mask, modifier) -> Method:
    if mask is None:
        raise Unavailable("no mask to make dense")
    dense = _dense_mask(mask, q, k)
    return Method("torch sdpa (dense bool mask)",
                  lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense), (q, k, v))


def _sdpa_bias(case, q, k, v, mask, modifier) -> Method:
    if case.bias is None:
        raise Unavailable("no bias")
    bias = dense_bias(case.bias, case.heads, q.shape[2], k.shape[2], q.dtype)
    if bias is None:
        raise Unavailable(f"{case.bias} is not an additive bias")
    bias = bias.to(q.device)
    if mask is not None:
        bias = bias.masked_fill(~_dense_mask(mask, q, k), -math.inf)
    return Method("torch sdpa (dense float bias)",
                  lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias), (q, k, v))


def _eager(case, q, k, v, mask, modifier) -> Method:
    lq, lk = q.shape[2], k.shape[2]
    arange = lambda n: torch.arange(n, device=q.device)
    idx = (arange(q.shape[0]).view(-1, 1, 1, 1), arange(q.shape[1]).view(1, -1, 1, 1),
           arange(lq).view(1, 1, -1, 1), arange(lk).view(1, 1, 1, -1))
    dense = None if mask is None else mask.materialize(lq, lk, batch=q.shape[0], device=q.device)

    def run():
        scores = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, H, Lq, Lk)
        if modifier is not None:
            scores = apply_modifier(modifier, scores, *idx, lq, lk)
        if dense is not None:
            scores = scores.masked_fill(~dense, -math.inf)
        return (torch.softmax(scores, -1) @ v.float()).to(q.dtype)
    return Method("plain torch (dense scores)", run, (q, k, v))


def _fp32(case, q, k, v, mask, modifier) -> Method:
    if q.dtype == torch.float32:
        raise Unavailable("inputs are float32 already")
    q32, k32, v32 = (t.detach().float().requires_grad_(t.requires_grad) for t in (q, k, v))
    base = ours(case, q32, k32, v32, mask, modifier)
    return Method(base.name + " (float32)", base.fn, (q32, k32, v32))


def theirs(kind: str, case, q, k, v, mask, modifier) -> Method:
    """The comparison method ``kind`` (one of :data:`KINDS`); raises :class:`Unavailable` when it cannot run."""
    if kind == "flex":
        from .flex import flex_method
        return flex_method(case, q, k, v, mask, modifier)
    if kind == "compiled-sdpa-mask":
        return _compiled(_sdpa_mask(case, q, k, v, mask, modifier), "compiled ")
    if kind == "attnkit-eager":
        return ours(case, q, k, v, mask, modifier)
    builders = {"sdpa": _sdpa, "sdpa-mask": _sdpa_mask, "sdpa-bias": _sdpa_bias, "eager": _eager, "fp32": _fp32}
    if kind not in builders:
        raise ValueError(f"unknown comparison {kind!r}; one of {', '.join(KINDS)}")
    return builders[kind](case, q, k, v, mask, modifier)
