"""Path ``bias-slabs``: additive biases on torch's fused CPU kernel, one slab of query rows at a time.

For an additive bias (a float tensor, :class:`~attnkit.bias.ALiBi`,
:class:`~attnkit.bias.RelativePositionBias`) the scores of query rows ``[s, e)``
are ``scale * Q[s:e] K^T + bias[s:e]``, with ``-inf`` where the mask forbids: a
slab is complete over the keys, so each slab is one exact call of torch's fused
flash kernel with that bias as its float mask, and nothing is merged.

A bias that depends on ``j - i`` only (ALiBi and relative positions; causal
masks too, as ``-inf`` past the diagonal) is never materialised: with the keys in
reverse order, ``bias[i, j'] = u[i + j']`` for one vector ``u`` per head, and the
slab is an ``as_strided`` view of ``u`` with strides ``(1, 1)``, which the kernel
reads like any mask. Other biases are built one slab at a time. Memory is
``O(Lq + Lk)`` per head or one slab of ``BUDGET`` elements, never ``O(Lq Lk)``.

Used only where the kernel computes attnkit's function: finite q, k, v (torch's
CPU kernel zeroes NaN rows), a bias without NaN or ``+inf`` (``-inf`` entries and
whole ``-inf`` rows are exact: weight 0, output 0), no dropout, and lse only
without autograd. The backward is in :mod:`.bias_slabs_grad`.
"""

from __future__ import annotations

import torch

from ..bias import AdditiveModifier
from ..functional import sinks
from ..functional.validate import Problem
from ..runtime import low_precision_math
from . import rules
from .bias_slabs_grad import SlabAttention
from .path_cost import PathCost, fused_attention, itemsize
from .pipeline import KernelOutput, dense_indices, upcast_inputs

__all__ = ["refusal", "run", "describe", "cost", "Plan"]

BUDGET = 1 << 21  # bias elements per materialised slab (8 MiB in float32)
MIN_ROWS = 64  # the fused kernel's query blocks are 32-256 rows: smaller slabs starve it
_NEG_INF = float("-inf")


def _lse_resolves(row_max: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether a float lse ``m + log(l)`` keeps ``log(l)`` for rows whose largest score is ``row_max``.

    The kernel's backward rebuilds the weights as ``exp(S - lse)``. Rounding ``lse`` to the
    dtype moves it by up to half an ulp of ``|m|``: the weights then err by that factor,
    and a row whose every score is ``finfo.min`` (a "mask" written as a bias) has weights
    ``exp(0) = 1`` instead of ``1/Lk``. Rows whose largest entry stays within
    ``2^-12 / eps`` of 0 (2048 in float32) keep the weights within ``2^-13``; a row of
    ``-inf`` (no allowed key) is exact. NaN and ``+inf`` fail too.
    """
    limit = _lse_limit(dtype)
    return bool(((row_max.abs() <= limit) | (row_max == _NEG_INF)).all())


def _lse_limit(dtype: torch.dtype) -> float:
    """The largest ``|score|`` whose lse keeps the weights within ``2^-13`` (see :func:`_lse_resolves`)."""
    return 2.0 ** -12 / torch.finfo(dtype).eps


def _bias_tensor_ok(bias: torch.Tensor, dtype: torch.dtype, masked: bool) -> bool:
    """No NaN, no ``+inf`` and no row whose largest entry is too far from 0 for the kernel's lse.

    With a mask, a row's largest *allowed* entry is what the lse holds, and the mask may
    leave a row only very negative entries (``finfo.min`` written as a mask), however
    large the row's unmasked maximum: then every finite entry must lie within the bound
    too (a second pass), so that any allowed subset of a row keeps its weights.
    """
    if bias.numel() == 0:  # no key, or no row: nothing to resolve
        return True
    if not _lse_resolves(bias.amax(-1), dtype):
        return False
    finite = torch.nan_to_num(bias.detach(), nan=0.0, posinf=0.0, neginf=0.0)
    return not masked or float(finite.amin()) >= -_lse_limit(dtype)


def _additive_bias(p: Problem) -> str | None:
    if p.bias is None and not isinstance(p.modifier, AdditiveModifier):
        return "needs an additive bias: a float tensor, ALiBi or RelativePositionBias"
    return None


@rules.reads_data
def _finite_bias(p: Problem) -> str | None:
    if p.bias is not None and not _bias_tensor_ok(p.bias, p.compute_dtype, p.mask is not None):
        return ("the bias holds NaN or +inf, or entries too far from 0 for the kernel's lse where they can be a "
                "row's largest allowed entry")
    if p.modifier is not None and not p.modifier.term_is_finite():
        return "the modifier's parameters hold NaN or inf"
    return None


REFUSALS = (rules.full_precision_kv,
            rules.fused_cpu_kernel, rules.softmax_of_dot_products, rules.equal_head_dims, _additive_bias,
            rules.no_weights, rules.no_dropout, rules.not_compiling, rules.lse_without_grad, rules.finite_inputs,
            _finite_bias)


def refusal(p: Problem) -> str | None:
    """Why the slab path cannot compute ``p`` exactly (None: it can)."""
    return rules.first_refusal(p, REFUSALS)


def _toeplitz(p: Problem) -> bool:
    """The bias is a function of ``(h, j - i)`` (and no parameter needs its gradient): view it, never build it."""
    relative = isinstance(p.modifier, AdditiveModifier) and p.modifier.relative
    return relative and (p.mask is None or p.mask.kind == "causal") and not p.learned


class Plan:
    """Slabs of query rows, the key order, and each slab's bias as the kernel reads it."""

    def __init__(self, p: Problem, dtype):
        batch, heads, lq, lk, _, _ = p.sizes
        self.p, self.dtype, self.scale = p, dtype, p.scale
        self.reversed = _toeplitz(p)
        rows = lq if self.reversed else max(MIN_ROWS, BUDGET // max(1, batch * heads * lk))
        self.slabs = [(s, min(lq, s + rows)) for s in range(0, lq, rows)]

    def bias(self, start: int, stop: int) -> torch.Tensor:
        """``(B|1, H|1, rows|1, Lk)`` float bias of rows ``[start, stop)``, ``-inf`` where masked."""
        p = self.p
        batch, heads, lq, lk, _, _ = p.sizes
        if self.reversed:
            return self._strided(start, stop)
        b, h, qi, ki = dense_indices(batch, heads, start, stop, 0, lk, p.q.device)
        term = p.modifier.term(b, h, qi, ki, lq, lk) if p.bias is None else (
            p.bias[:, :, start:stop] if p.bias.shape[2] > 1 else p.bias)
        term = term.to(self.dtype)
        if p.mask is not None:
            term = term.masked_fill(~p.mask.allows(b, h, qi, ki, lq, lk), _NEG_INF)
        return term

    def _strided(self, start: int, stop: int) -> torch.Tensor:
        """Keys reversed (``j' = Lk - 1 - j``): ``bias[i, j'] = u[i - start + j']`` with ``u[t] = f(Lk-1-start-t)``."""
        p = self.p
        _, heads, lq, lk, _, _ = p.sizes
        rows = stop - start
        rel = (lk - 1 - start) - torch.arange(rows + lk - 1, device=p.q.device)  # j - i along u
        h = torch.arange(heads, device=p.q.device).view(-1, 1)
        u = p.modifier.relative_term(h, rel.view(1, -1), lq, lk).to(self.dtype)  # (H, rows + Lk - 1)
        if p.mask is not None:  # causal: key j allowed iff j - i <= offset
            u = u.masked_fill(rel.view(1, -1) > (lk - lq if p.mask.align == "bottom_right" else 0), _NEG_INF)
        u = torch.broadcast_to(u, (heads, rows + lk - 1)).contiguous()
        return u.as_strided((1, heads, rows, lk), (0, u.stride(0), 1, 1))

    def keys(self, k, v):
        return (k.flip(2), v.flip(2)) if self.reversed else (k, v)

    def forward(self, q, k, v):
        """``(out, lse)`` over all slabs (``k, v`` as :meth:`keys` returns them); lse is 0 for rows with no key."""
        outs, lses = [], []
        for s, e in self.slabs:
            out, lse = rules.FLASH(q[:, :, s:e], k, v, 0.0, False, attn_mask=self.bias(s, e), scale=self.scale)
            outs.append(out)
            lses.append(lse)
        return (outs[0], lses[0]) if len(outs) == 1 else (torch.cat(outs, 2), torch.cat(lses, 2))

    def empty_rows(self) -> torch.Tensor:
        """Bool ``(B|1, H|1, Lq)``: rows whose every bias entry is ``-inf`` (no allowed key)."""
        parts = [torch.isneginf(self.bias(s, e)).all(-1) for s, e in self.slabs]
        return parts[0] if len(parts) == 1 else torch.cat(parts, 2)


def describe(p: Problem) -> str:
    plan = Plan(p, p.compute_dtype)
    how = "viewed from one vector per head (keys reversed)" if plan.reversed else "built per slab"
    return (f"additive bias on torch's fused kernel, {len(plan.slabs)} slab(s) of query rows, "
            f"bias {how}")


def _inputs(p: Problem):
    """q, k, v for the kernel: bfloat16/float16 stay as they are where the CPU computes them natively (the fused
    kernel accumulates in float32, as torch's SDPA does; see attnkit.runtime); everything else, and any learned
    bias, in the compute dtype."""
    if low_precision_math(p.q.dtype, p.q.device) != p.q.dtype or p.learned:
        return upcast_inputs(p)
    k, v = p.k, p.v
    if p.groups > 1:
        k, v = k.repeat_interleave(p.groups, dim=1), v.repeat_interleave(p.groups, dim=1)
    return p.q.contiguous(), k.contiguous(), v.contiguous()


def backward_differentiable(p: Problem) -> bool:
    """Its backward is written by hand: a second derivative recomputes the call (pipeline.twice_differentiable)."""
    return False


def run(p: Problem) -> KernelOutput:
    """Out in the compute dtype, or in bfloat16/float16 for such inputs; lse when asked (without autograd)."""
    q, k, v = _inputs(p)
    plan = Plan(p, p.compute_dtype)
    if p.needs_grad:
        return KernelOutput(SlabAttention.apply(plan, q, k, v, p.sinks, *p.learned), None, None)
    with torch.no_grad():
        out, lse = plan.forward(q, *plan.keys(k, v))
        lse = lse.masked_fill(plan.empty_rows(), _NEG_INF) if p.return_lse else lse  # the kernel says 0 there
        if p.sinks is not None:
            out, lse = sinks.joined(out, lse, p.sinks)
        return KernelOutput(out, None, lse if p.return_lse else None)


def cost(p: Problem, grad: bool = False) -> PathCost:
    """torch's fused kernel over every pair, slab by slab; the backward recomputes the scores."""
    b, h, lq, lk, d, dv = p.sizes
    pairs = b * h * lq * lk
    return PathCost(pairs, BUDGET * itemsize(p), fused=fused_attention("attention (fused kernel, bias in row slabs)",
                                                                       pairs, d, dv), materialized=False)
