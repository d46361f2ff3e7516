"""Path ``torch-sdpa``: torch's fused attention kernel, used only where it computes attnkit's function.

PyTorch's fused CPU kernel is the fastest dense path here, but on torch 2.13 it can
turn a NaN query row into zeros, lets NaN in a masked key leak (RELIABILITY rows
21-22), reads strided inputs wrongly (row 28) and, with ``is_causal`` and a scale
``<= 0``, returns NaN for finite inputs; and it has no weights, bias modifiers or
other scores. So it takes softmax of (scaled) dot products, contiguous, with a mask
it reads exactly. Sinks join the kernel's ``(out, lse)`` and its backward runs from the
joined pair (:mod:`attnkit.functional.sinks`), on the CPU kernel only.

Masks, in O(1) for the common calls: none; causal through ``is_causal`` when the
alignments agree (top-left, or ``Lq == Lk``) and the scale is positive; bottom-right
causal with one query (decoding over a KV cache) as no mask at all, and with several
(chunked prefill) as a cached ``(Lq, Lk)`` float mask; key padding as a cached
``(B, 1, 1, Lk)`` float mask; a user's bool tensor converted as torch's SDPA does.

Finiteness is checked *after* the kernel, not before: on CPU the kernel is called
directly (``aten._scaled_dot_product_flash_attention_for_cpu``) for its
log-sum-exp. NaN or inf in q, k or v that the result depends on either reaches the
output or the lse (a NaN among a row's scores makes its sum NaN; a masked NaN key
gives ``NaN + (-inf)``), or makes every score of a row NaN or ``-inf``, which the
kernel answers with output 0 and lse exactly 0, as it answers a row with no allowed
key; rows the mask leaves empty are known (:class:`KernelMask`), so any other lse
of 0 is not trusted (:func:`trustworthy`). The check is ``O(B H Lq (Dv + 1))``
instead of a pass over q, k and v. When it fails, :class:`UntrustedOutput` tells the
dispatcher to decide the call again without this path, after the exact checks
(padded K/V rows zeroed, one finiteness pass). With dropout, or with ``Dv != D`` on
the CPU, torch's public SDPA runs after a finiteness pass over q, k, v.

On other devices (CUDA, MPS) torch's public ``F.scaled_dot_product_attention`` runs
(flash, memory-efficient or cuDNN, as torch picks for the call; grouped K/V heads
read unexpanded), and the same kind of check follows it: those kernels return no lse,
so the sums of the output and of q, k, v stand for it (one reduction and one
synchronisation; with finite inputs and a finite output every row is torch's exact
answer). A row the mask leaves with no key is handed to the kernel with every key
allowed and set to 0 afterwards, so no kernel ever sees a row of ``-inf`` (whose
answer, and whose gradient, differ between kernels) and its gradients are 0.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from ..functional import sinks
from ..functional.validate import Problem
from ..masks import cache
from ..runtime import low_precision_math
from . import rules
from .path_cost import PathCost, fused_attention, itemsize
from .pipeline import KernelOutput

__all__ = ["UntrustedOutput", "KernelMask", "REFUSALS", "LANE", "refusal", "run", "describe", "cost", "kernel_mask",
           "trustworthy", "sums_finite", "checks_output", "op_forward", "op_backward", "flash"]

_CAUSAL_MASKS = cache.BoundedCache(max_entries=32, max_bytes=1 << 24)  # causal (Lq, Lk) float masks
_NEG_INF = float("-inf")
_ONES: dict = {}  # a 0-dim 1 per dtype, for the output check


class UntrustedOutput(Exception):
    """Raised by :func:`run` when the kernel's output or lse shows NaN, inf or an unexplained lse of 0."""


class KernelMask(NamedTuple):
    """What the kernel reads for the mask: a float mask (0 / ``-inf``) or None, the causal flag, and the rows
    with no allowed key (bool, broadcastable to ``(B, H, Lq)``; None when there are none)."""

    float_mask: torch.Tensor | None
    is_causal: bool
    empty_rows: torch.Tensor | None


checks_output = rules.checks_output  # the facts live with the rules, which read them without entering this file
causal_flag = rules.causal_flag

REFUSALS = (rules.full_precision_kv,
            rules.softmax_of_dot_products, rules.no_bias, rules.no_weights, rules.lse_from_cpu_kernel,
            rules.not_compiling, rules.sinks_on_cpu_kernel, rules.output_checked_or_finite)


# The fast lane (kernels/lane.py) takes a call where these pass, on the call's arguments (no validation, no data):
# this path's rules that read no data, and the lane's own (torch's kernel called on q, k, v as they are).
LANE = (*(rule for rule in REFUSALS if not getattr(rule, "reads_data", False)),
        rules.output_checked, rules.equal_head_dims, rules.read_in_place, rules.mask_keeps_every_row)


def refusal(p: Problem) -> str | None:
    return rules.first_refusal(p, REFUSALS)


def _additive(allowed: torch.Tensor, dtype) -> torch.Tensor:
    """A bool mask as the float mask the kernel reads: 0 where allowed, ``-inf`` elsewhere."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, _NEG_INF)


def _with_empty_rows(allowed: torch.Tensor, dtype, open_empty: bool = False) -> KernelMask:
    """``open_empty`` (off the CPU): a row with no allowed key is given every key, and :func:`run` zeroes it after,
    so no kernel sees a row of ``-inf``."""
    empty = ~allowed.any(-1)
    if open_empty:
        allowed = allowed | empty[..., None]
    return KernelMask(_additive(allowed, dtype), False, empty)


_NO_MASK, _IS_CAUSAL = KernelMask(None, False, None), KernelMask(None, True, None)


def causal_mask(lq: int, lk: int, offset: int, dtype, like: torch.Tensor) -> KernelMask:
    """Query i sees keys ``j <= i + offset``: no mask for one query over every key (decoding), else cached, on the
    device of ``like`` (read only then: a decoding step builds no device object)."""
    if lq == 1 and offset >= lk - 1:
        return _NO_MASK
    device = like.device
    key = (lq, lk, offset, dtype, str(device))
    return _CAUSAL_MASKS.get_or_build(key, lambda: _with_empty_rows(
        torch.ones(lq, lk, dtype=torch.bool, device=device).tril(offset), dtype, torch.device(device).type != "cpu"))


def kernel_mask(p: Problem, dtype) -> KernelMask:
    """The mask as the kernel reads it, in ``dtype``."""
    m = p.mask
    batch, heads, lq, lk, _, _ = p.sizes
    kind = "full" if m is None else m.kind
    if kind == "full":
        return _NO_MASK
    if causal_flag(p):
        return _IS_CAUSAL
    if kind == "causal":
        return causal_mask(lq, lk, lk - lq if m.align == "bottom_right" else 0, dtype, p.q)
    open_empty = rules.device_type(p) != "cpu"
    if kind == "tensor":
        return _with_empty_rows(m.tensor, dtype, open_empty)
    if kind == "keys":  # a (B, H|1, 1, Lk) mask, built once per mask and sizes
        key = (lk, batch, heads, dtype, str(p.q.device), open_empty)
        return cache.on(m, "sdpa", max_entries=8).get_or_build(key, lambda: _with_empty_rows(
            m.materialize(1, lk, batch=batch, heads=heads, device=p.q.device), dtype, open_empty))
    return _with_empty_rows(m.materialize(lq, lk, batch=batch, heads=heads, device=p.q.device), dtype, open_empty)


def trustworthy(out: torch.Tensor, lse: torch.Tensor, empty_rows: torch.Tensor | None) -> bool:
    """No NaN or inf in the output or the lse, and no lse exactly 0 outside the rows the mask leaves empty.

    NaN or inf anywhere in either makes a sum non-finite. The kernel gives a row whose
    every score is NaN or ``-inf`` (a NaN query row; a row whose only allowed keys are
    NaN) output 0 and lse 0, as it does for a row with no allowed key, so a row with
    lse 0 is trusted only where the mask allows no key. A huge finite sum, or a genuine
    lse of exactly 0, only costs a needless exact run.
    """
    if out.requires_grad:
        out, lse = out.detach(), lse.detach()
    if empty_rows is not None:
        lse = lse.masked_fill(empty_rows, 1.0)
    if lse.dtype not in _ONES:
        _ONES[lse.dtype] = torch.ones((), dtype=lse.dtype)
    # lse + 1/lse: NaN for NaN, +-inf for +-inf and for exactly 0. Few ops: each costs microseconds on tiny tensors.
    return math.isfinite(torch.addcdiv(lse, _ONES[lse.dtype], lse).sum().item() + out.sum().item())


def sums_finite(out: torch.Tensor, inputs) -> bool:
    """No NaN or inf in ``out`` nor in the ``inputs`` (q, k, v): the check of a kernel that returns no lse.

    With finite q, k, v every row has a finite largest score, so a finite output is the
    kernel's exact answer; NaN or inf anywhere makes a float32 sum non-finite. One
    reduction per distinct tensor and one ``.item()`` (a synchronisation on CUDA).
    """
    distinct = {id(t): t.detach() for t in (out, *inputs)}.values()
    return math.isfinite(torch.stack([t.sum(dtype=torch.float32) for t in distinct]).sum().item())


def _readable(t: torch.Tensor, grad: bool) -> torch.Tensor:
    """``t`` as the CPU kernel reads it right: torch 2.13's forward misreads an innermost stride other than 1
    (RELIABILITY row 28) but reads any other strides (a KV cache's view of its buffer, permuted heads) as they
    are, so only those are copied; with a gradient every input is made contiguous for the backward kernel."""
    return t.contiguous() if grad or t.stride(-1) != 1 else t


def backward_differentiable(p: Problem) -> bool:
    """torch's CPU kernel, called directly, has no second derivative; its public entry point's math path has."""
    return not checks_output(p)


class _WithSinks(torch.autograd.Function):
    """The CPU kernel with sinks: its ``(O, lse)`` joined with them, and its own backward from the joined pair
    (which rebuilds the sink call's probabilities), plus the sinks' gradient (:mod:`attnkit.functional.sinks`)."""

    @staticmethod
    def forward(ctx, q, k, v, sink_logits, km: KernelMask, scale: float, check: bool):
        out, lse = rules.FLASH(q, k, v, 0.0, km.is_causal, attn_mask=km.float_mask, scale=scale)
        if check and not trustworthy(out, lse, km.empty_rows):
            raise UntrustedOutput
        if km.empty_rows is not None:  # the kernel's lse there is 0; the sink alone is those rows' sum
            lse = lse.masked_fill(km.empty_rows, _NEG_INF)
        out, lse = sinks.joined(out, lse, sink_logits)
        ctx.save_for_backward(q, k, v, out, lse, sink_logits)
        ctx.km, ctx.scale = km, scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse, sink_logits = ctx.saved_tensors
        dout = dout.contiguous()
        # A row with no key under a -inf sink has lse_s = -inf, and the kernel would rebuild its weights as
        # exp(-inf - (-inf)) = NaN; with the lse of 0 the kernel gives such rows itself, they are exp(-inf) = 0.
        kernel_lse = lse.masked_fill(lse == _NEG_INF, 0.0)
        dq, dk, dv = rules.FLASH_BACKWARD(dout, q, k, v, out, kernel_lse, 0.0, ctx.km.is_causal,
                                          attn_mask=ctx.km.float_mask, scale=ctx.scale)[:3]
        return dq, dk, dv, sinks.kernel_gradient(dout, out, lse, sink_logits), None, None, None


# Keys from which grouped-query heads run as rows of one product (:func:`flash`): below, reading the keys once per
# query head costs less than the copy that puts the rows back into heads.
GROUPED_KEYS = 256


def flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, float_mask, scale: float,
          lse_per_head: bool = True):
    """torch's CPU kernel's ``(out (B, H, Lq, Dv), lse (B, H, Lq))``. With grouped-query heads, no mask and no
    graph, the query heads of a key/value head run as rows of one product ``(B, H_kv, (H / H_kv) Lq, D)``: each
    key and value is read once per group instead of once per query head (a decoding step takes about half the
    time); the rows are the same dot products, summed in the kernel's blocking for more rows (not always the
    bits of the grouped-head call, which is why the lane and this path both call it). ``lse_per_head=False``: the
    lse of a grouped call stays ``(B, H_kv, (H / H_kv) Lq)``, the same rows uncopied (a caller that only checks
    them; the kernel stores them in another order, so the per-head shape is a copy)."""
    batch, heads, lq, d = q.shape
    hkv = k.shape[1]
    if (heads != hkv and k.shape[2] >= GROUPED_KEYS and not is_causal and float_mask is None and q.is_contiguous()
            and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))):
        out, lse = rules.FLASH(q.view(batch, hkv, heads // hkv * lq, d), k, v, 0.0, False, scale=scale)[:2]
        return out.reshape(batch, heads, lq, v.shape[-1]), lse.reshape(batch, heads, lq) if lse_per_head else lse
    return rules.FLASH(q, k, v, 0.0, is_causal, attn_mask=float_mask, scale=scale)[:2]


def run(p: Problem) -> KernelOutput:
    """bfloat16/float16 inputs run in float32 where the CPU has no matmul units for them (attnkit.runtime)."""
    dtype = low_precision_math(p.q.dtype, p.q.device)
    q, k, v = (t if t.dtype == dtype else t.to(dtype) for t in (p.q, p.k, p.v))
    km = kernel_mask(p, dtype)
    if checks_output(p) and rules.cpu_flash(p):
        q, k, v = (_readable(t, p.needs_grad) for t in (q, k, v))
        if p.sinks is not None:
            return KernelOutput(_WithSinks.apply(q, k, v, p.sinks, km, p.scale, not p.finiteness_known), None, None)
        out, lse = flash(q, k, v, km.is_causal, km.float_mask, p.scale)
        if not p.finiteness_known and not trustworthy(out, lse, km.empty_rows):
            raise UntrustedOutput
        if not p.return_lse:
            return KernelOutput(out, None, None)
        return KernelOutput(out, None, lse if km.empty_rows is None else lse.masked_fill(km.empty_rows, _NEG_INF))
    # bool(): under torch.jit.trace sizes are traced tensors, and torch wants a Python bool here
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=km.float_mask, dropout_p=p.dropout_p,
                                         is_causal=km.is_causal, scale=p.scale, enable_gqa=bool(p.groups > 1))
    if rules.device_type(p) != "cpu":
        if km.empty_rows is not None:
            out = out.masked_fill(km.empty_rows[..., None], 0.0)
        if checks_output(p) and not p.finiteness_known:
            if not sums_finite(out, (p.q, p.k, p.v)):
                raise UntrustedOutput
            p.memo["inputs_finite"] = True  # finite sums of q, k, v: what the finiteness pass would have learnt
    return KernelOutput(out, None, None)


def describe(p: Problem) -> str:
    km = kernel_mask(p, p.compute_dtype)
    mask = ("is_causal" if km.is_causal else "no mask" if km.float_mask is None
            else f"a float mask {tuple(km.float_mask.shape)}")
    if not checks_output(p):
        how = "after a finiteness pass over q, k, v"
    elif rules.cpu_flash(p):
        how = "the output checked for NaN/inf after"
    else:
        how = (f"torch's public kernel on {rules.device_type(p)} (flash, memory-efficient or cuDNN, as torch picks), "
               "the sums of the output and of q, k, v checked after")
    return f"torch's fused kernel, {mask}, {how}"


def cost(p: Problem, grad: bool = False) -> PathCost:
    """torch's formulas: the fused kernel (``D == Dv``, no dropout) recomputes the scores in its backward;
    otherwise torch runs its math path, whose scores and weights exist in memory."""
    b, h, lq, lk, d, dv = p.sizes
    pairs = b * h * lq * lk
    flash = d == dv and not p.dropout_p
    label, fwd, bwd = fused_attention("attention (SDPA)", pairs, d, dv)
    mask = kernel_mask(p, p.compute_dtype).float_mask
    workspace = (0 if mask is None else mask.numel() * itemsize(p)) + (0 if flash else 3 * pairs * itemsize(p))
    return PathCost(pairs, workspace, fused=(label, fwd, bwd if flash else 2 * fwd), materialized=not flash)


def _kernel_inputs(p: Problem, rows: bool = False):
    """q, k, v in the compute dtype, contiguous; ``rows``: any layout whose feature axis has stride 1 is kept (the
    forward kernel reads such strides, e.g. a KV cache's prefix view, which a copy would read whole every step)."""
    dt = p.compute_dtype
    return tuple(t.to(dt) if rows and t.stride(-1) == 1 else t.to(dt).contiguous() for t in (p.q, p.k, p.v))


def op_forward(p: Problem):
    """For the compiled operator: ``(out, lse)`` of the CPU kernel, or None where :func:`run` would not call it."""
    if not (checks_output(p) and rules.cpu_flash(p)):
        return None
    q, k, v = _kernel_inputs(p, rows=True)
    km = kernel_mask(p, q.dtype)
    out, lse = rules.FLASH(q, k, v, 0.0, km.is_causal, attn_mask=km.float_mask, scale=p.scale)
    if not trustworthy(out, lse, km.empty_rows):
        raise UntrustedOutput
    return out, lse


def op_backward(p: Problem, out, lse, dout):
    """For the compiled operator: ``dq, dk, dv`` from the kernel's own lse."""
    q, k, v = _kernel_inputs(p)
    km = kernel_mask(p, q.dtype)
    return rules.FLASH_BACKWARD(dout.to(q.dtype).contiguous(), q, k, v, out, lse, 0.0, km.is_causal,
                                attn_mask=km.float_mask, scale=p.scale)[:3]
