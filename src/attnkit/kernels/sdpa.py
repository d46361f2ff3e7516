"""Path ``torch-sdpa``: torch's fused attention kernel, used only where it computes attnkit's function.

PyTorch's fused CPU kernel is the fastest dense path here, but on torch 2.13 it
turns a NaN query row into zeros and lets NaN in a masked key leak (RELIABILITY
rows 21-22), and it has no weights, bias modifiers or other scores. So it takes
softmax of (scaled) dot products with a mask it can represent without a
``(Lq, Lk)`` picture of our own, or any mask when dense is the better plan.

Masks, in O(1) for the common calls: none; causal through ``is_causal`` when the
alignments agree (top-left, or ``Lq == Lk``); bottom-right causal with one query
(decoding over a KV cache) as no mask at all, and with a few queries (chunked
prefill) as a small cached ``(Lq, Lk)`` float mask; key padding as a cached
``(B, 1, 1, Lk)`` float mask; a user's bool tensor as given.

Finiteness is checked *after* the kernel, not before: on CPU the kernel is called
directly (``aten._scaled_dot_product_flash_attention_for_cpu``) for its
log-sum-exp. NaN or inf in q, k or v that the result depends on either reaches
the output or the lse (a NaN among a row's scores makes its sum NaN; a masked NaN
key gives ``NaN - inf``), or makes every score of a row NaN or ``-inf``, which
the kernel answers with output 0 and lse exactly 0 (:func:`_trustworthy`). So the
check is ``O(B H Lq (Dv + 1))`` instead of a pass over q, k and v. When it fails,
:class:`NonFiniteInputs` tells the dispatcher to choose again after one exact
check of the inputs (an exact path runs if they are not finite). With dropout, or on
other devices, or with ``Dv != D``, torch's public SDPA runs after the check on q, k and v instead.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..functional import cache
from ..functional.masks import TensorMask, _Causal, _Full
from ..functional.validate import Problem
from ..runtime import low_precision_math
from . import rules
from .path_cost import PathCost, fused_attention, itemsize
from .pipeline import KernelOutput

__all__ = ["NonFiniteInputs", "refusal", "run", "describe", "cost", "simple_mask"]

_CAUSAL_MASKS = cache.BoundedCache(max_entries=32, max_bytes=1 << 24)  # bottom-right (Lq, Lk) float masks
_NEG_INF = float("-inf")
_ONES: dict = {}  # a 0-dim 1 per dtype, for the output check


class NonFiniteInputs(Exception):
    """Raised by :func:`run` when its output shows NaN or inf: choose again, knowing the inputs are not finite."""


def _checks_output(p: Problem) -> bool:
    """Whether :func:`run` calls the CPU kernel and checks its output instead of checking the inputs first."""
    return rules.FLASH is not None and p.q.device.type == "cpu" and p.dropout_p == 0 and p.sizes[4] == p.sizes[5]


def _finiteness(p: Problem) -> str | None:
    return rules.not_known_non_finite(p) if _checks_output(p) else rules.finite_inputs(p)


def _no_weights_or_lse(p: Problem) -> str | None:
    return "returns neither weights nor lse" if p.return_weights or p.return_lse else None


REFUSALS = (rules.softmax_of_dot_products, rules.no_bias, _no_weights_or_lse, rules.not_compiling, _finiteness)


def refusal(p: Problem) -> str | None:
    return rules.first_refusal(p, REFUSALS)


def causal_flag(p: Problem) -> bool:
    """True when the mask is causal with an alignment SDPA's ``is_causal`` (top-left) matches."""
    _, _, lq, lk, _, _ = p.sizes
    return isinstance(p.mask, _Causal) and (p.mask.align == "top_left" or lq == lk)


def simple_mask(p: Problem) -> bool:
    """Masks this path takes without evaluating a ``(Lq, Lk)`` picture per call: the O(1) dispatch cases."""
    m = p.mask
    return m is None or isinstance(m, (_Full, TensorMask, _Causal)) or "q" not in m.uses


def _additive(allowed: torch.Tensor, dtype) -> torch.Tensor:
    """A bool mask as the float mask the kernel reads: 0 where allowed, ``-inf`` elsewhere."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, _NEG_INF)


def _bottom_right_causal(lq: int, lk: int, dtype, device) -> torch.Tensor | None:
    """Query i sees keys ``j <= i + Lk - Lq``: None (every key) for one query over at least one key."""
    if lq == 1 and lk >= 1:
        return None
    key = (lq, lk, dtype, str(device))
    return _CAUSAL_MASKS.get_or_build(key, lambda: _additive(
        torch.ones(lq, lk, dtype=torch.bool, device=device).tril(lk - lq), dtype))


def kernel_mask(p: Problem, dtype):
    """``(attn_mask, is_causal)``: None, the causal flag, or a float mask (0 / ``-inf``) in ``dtype``."""
    m = p.mask
    batch, heads, lq, lk, _, _ = p.sizes
    if m is None or isinstance(m, _Full):
        return None, False
    if causal_flag(p):
        return None, True
    if isinstance(m, _Causal):
        return _bottom_right_causal(lq, lk, dtype, p.q.device), False
    if isinstance(m, TensorMask):
        return _additive(m.tensor, dtype), False
    if "q" not in m.uses:  # key-only (padding): a (B, 1, 1, Lk) mask, built once per mask and sizes
        key = (lk, batch, heads, dtype, str(p.q.device))
        return cache.on(m, "sdpa", max_entries=8).get_or_build(key, lambda: _additive(
            m.materialize(1, lk, batch=batch, heads=heads, device=p.q.device), dtype)), False
    return _additive(m.materialize(lq, lk, batch=batch, heads=heads, device=p.q.device), dtype), False


def _trustworthy(out: torch.Tensor, lse: torch.Tensor) -> bool:
    """No NaN or inf in the output or the lse, and no row with lse exactly 0.

    NaN or inf anywhere in either makes a sum non-finite. The kernel gives a row whose
    every score is NaN or ``-inf`` (a NaN query row; a row whose only allowed keys are
    NaN) output 0 and lse 0, as it does for a row with no allowed key, so a row with
    lse 0 is not trusted either. A huge finite sum, or a genuine lse of exactly 0,
    only costs a needless exact check.
    """
    if out.requires_grad:
        out, lse = out.detach(), lse.detach()
    # lse + 1/lse: NaN for NaN, +-inf for +-inf and for exactly 0. Few ops: each costs microseconds on tiny tensors.
    one = _ONES.get(lse.dtype) or _ONES.setdefault(lse.dtype, torch.ones((), dtype=lse.dtype))
    return math.isfinite(torch.addcdiv(lse, one, lse).sum().item() + out.sum().item())


def run(p: Problem) -> KernelOutput:
    """bfloat16/float16 inputs run in float32 where the CPU has no matmul units for them (attnkit.runtime)."""
    dtype = low_precision_math(p.q.dtype, p.q.device)
    q, k, v = (t if t.dtype == dtype else t.to(dtype) for t in (p.q, p.k, p.v))
    attn_mask, is_causal = kernel_mask(p, dtype)
    if _checks_output(p):  # the kernel reads strided inputs wrongly (torch 2.13): contiguous, a no-op when already
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse = rules.FLASH.default(q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=p.scale)
        if not p.finiteness_known and not _trustworthy(out, lse):
            raise NonFiniteInputs
        return KernelOutput(out, None, None)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p.dropout_p,
                                         is_causal=is_causal, scale=p.scale, enable_gqa=p.groups > 1)
    return KernelOutput(out, None, None)


def describe(p: Problem) -> str:
    how = "the output checked for NaN/inf after" if _checks_output(p) else "after a finiteness pass over q, k, v"
    mask = ("is_causal" if causal_flag(p) else "no mask" if kernel_mask_is_none(p) else "a float mask")
    return f"torch's fused kernel, {mask}, {how}"


def kernel_mask_is_none(p: Problem) -> bool:
    m, (_, _, lq, lk, _, _) = p.mask, p.sizes
    return m is None or isinstance(m, _Full) or (isinstance(m, _Causal) and lq == 1 and lk >= 1)


def cost(p: Problem, grad: bool = False) -> PathCost:
    """torch's formulas: the fused kernel (``D == Dv``, no dropout) recomputes the scores in its backward;
    otherwise torch runs its math path, whose scores and weights exist in memory."""
    b, h, lq, lk, d, dv = p.sizes
    pairs = b * h * lq * lk
    flash = d == dv and not p.dropout_p
    label, fwd, bwd = fused_attention("attention (SDPA)", pairs, d, dv)
    masked = p.mask is not None and not (kernel_mask_is_none(p) or causal_flag(p))
    workspace = (b * lq * lk * itemsize(p) if masked else 0) + (0 if flash else 3 * pairs * itemsize(p))
    return PathCost(pairs, workspace, fused=(label, fwd, bwd if flash else 2 * fwd), materialized=not flash)
