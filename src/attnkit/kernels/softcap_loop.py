"""Path ``softcap-loop``: soft-capped attention without a running maximum.

``softmax(cap * tanh(scale * q k^T / cap)) v``.

Soft-capping (Gemma 2, arXiv:2408.00118) bounds every score to ``[-cap, cap]``,
so the softmax needs no row maximum: with one fixed shift ``c`` per problem,
``exp(cap * tanh(.) - c)`` neither overflows (summed over ``Lk`` keys) nor
underflows (the largest entry of a row stays a normal float) when
``2 cap + log(Lk)`` fits the dtype's exponent range (``cap`` up to about 80 in
float32). Softmax is shift-invariant, so the result is exact; the online-softmax
rescaling of :mod:`.online_softmax` disappears and each key block costs one matmul,
``tanh``, one fused multiply-add (``torch.add`` with ``alpha``: ``cap * tanh - c``
in base 2), ``exp2`` (all in place), a row sum and a matmul with V::

    e = exp2(log2(e) * (cap * tanh(q' k^T) - c))   with q' = q * scale / cap
    out = (sum_blocks e V) / (sum_blocks rowsum(e));   lse = log(sum rowsum(e)) + c

``tanh`` was most of the elementwise cost (torch's is about 3.2 ns an element on
one AVX2 core, an add or a multiply 0.11 ns). In float32 a block whose arguments all
lie in ``[-2, 2]`` (``|score| <= 2 cap``, the usual case: the cap bounds outliers)
uses the [7/6] Pade approximant of ``tanh`` instead (:func:`tanh_`: nine fused
passes, about 2 ulp); other blocks and dtypes use ``torch.tanh``.
``tanh(x) = 2 sigmoid(2x) - 1`` is cheaper still but was measured and dropped:
``sigmoid`` is near 1/2 where ``tanh`` is near 0, so the score would carry an
absolute error of about ``cap * eps`` instead of ``eps * |score|``, 2-5x the plain
float32 error at cap 50, beyond the DESIGN.md tolerance.

Under autograd a custom backward (:mod:`.softcap_grad`) recomputes each block
from the saved ``lse``; nothing of size ``Lq x Lk`` is kept.
"""

from __future__ import annotations

import math

import torch

from ..bias import Softcap
from ..functional.normalize import guard_empty_rows
from ..functional.validate import Problem
from . import rules
from .path_cost import PathCost, fused_attention, itemsize
from .pipeline import KernelOutput, Workspace, dense_indices, join_sinks, upcast_inputs, without_sinks
from .softcap_grad import SoftcapAttention

__all__ = ["refusal", "run", "shift", "describe", "Blocks"]

# (query rows, score elements) per block; keys per block follow. Blocks of 1 MiB (128 rows x 256 keys at
# B*H = 8) keep a block's elementwise passes nearer the core than 2 MiB ones: forward+backward at 1 thread,
# against SDPA's unbiased time, 1.92x -> 1.82x at L = 2048 and 1.72x -> 1.55x at L = 4096 for (256, 1 << 19)
# -> (128, 1 << 18) (medians of 5 and 4 interleaved rounds on a loaded machine; spreads overlap).
FORWARD_BLOCKS = (128, 1 << 18)

LOG2E = 1.0 / math.log(2.0)

# tanh(x) = x P(x^2) / Q(x^2): the [7/6] Pade approximant, i.e. Lambert's continued fraction
# x / (1 + x^2 / (3 + x^2 / (5 + ... + x^2 / 13))) multiplied out; its relative error is under 1.2e-8
# for |x| <= 2 (float32 evaluation adds about 2 ulp). Coefficients of P and Q, constant term first.
PADE_P = (1.0, 17325 / 135135, 378 / 135135, 1 / 135135)
PADE_Q = (1.0, 62370 / 135135, 3150 / 135135, 28 / 135135)
PADE_LIMIT = 2.0


def _poly_(out, u, coeffs, one):
    """``out = c0 + c1 u + c2 u^2 + c3 u^3`` by Horner's rule, one fused pass a step (``out`` is not ``u``)."""
    c0, c1, c2 = (one * c for c in coeffs[:3])
    torch.add(c2, u, alpha=coeffs[3], out=out)
    return torch.addcmul(c0, torch.addcmul(c1, out, u, out=out), u, out=out)


def tanh_(x, ws: Workspace, bounded: bool = False):
    """``tanh`` of a block in place: the Pade approximant when ``|x| <= PADE_LIMIT`` in the whole block.

    Nine passes of adds and multiplies (about 1.2 ns an element on one AVX2 core) instead of
    torch's ``tanh`` (about 3.2 ns); a block with a larger or a NaN value uses ``torch.tanh_``.
    ``bounded``: the caller knows that ``|x| <= PADE_LIMIT`` (no check). Float32 only: the
    approximant's 1.2e-8 is float32 rounding, not float64's, so other dtypes use ``torch.tanh_``.
    """
    if x.numel() == 0 or x.dtype != torch.float32:
        return x.tanh_()
    if not bounded:
        lo, hi = torch.aminmax(x)
        if not bool((lo >= -PADE_LIMIT) & (hi <= PADE_LIMIT)):
            return x.tanh_()
    one = x.new_ones(())
    u = torch.mul(x, x, out=ws.take("pade_u", *x.shape))
    p = _poly_(ws.take("pade_p", *x.shape), u, PADE_P, one).mul_(x)
    return torch.div(p, _poly_(ws.take("pade_q", *x.shape), u, PADE_Q, one), out=x)


def shift(cap: float, kv_len: int, dtype) -> float | None:
    """The fixed shift ``c`` for ``exp(cap * tanh - c)``, or None when the dtype's range is too small."""
    info = torch.finfo(dtype)
    hi, lo = math.log(info.max) - 1.0, math.log(info.tiny) + 1.0
    c = max(0.0, cap + math.log(max(1, kv_len)) - hi)
    return c if -cap - c >= lo else None


def _softcap_alone(p: Problem) -> str | None:
    return "a Softcap modifier alone" if type(p.modifier) is not Softcap or p.bias is not None else None


def _shift_fits(p: Problem) -> str | None:
    if shift(p.modifier.cap, p.sizes[3], p.compute_dtype) is None:
        return f"cap={p.modifier.cap} too large for a fixed shift in {p.compute_dtype}"
    return None


REFUSALS = (rules.full_precision_kv,
            _softcap_alone, rules.softmax_of_dot_products, rules.no_dropout, rules.no_weights, rules.not_compiling,
            _shift_fits)


def refusal(p: Problem) -> str | None:
    return rules.first_refusal(p, REFUSALS)


class Blocks:
    """Row and key blocks of a problem, the mask of each block, and the weights of a block."""

    def __init__(self, p: Problem, sizes: tuple[int, int] | None = None):
        batch, heads, lq, lk, _, _ = p.sizes
        sizes = FORWARD_BLOCKS if sizes is None else sizes  # read at call time (tests shrink it)
        self.p, self.cap = p, p.modifier.cap
        self.c = shift(self.cap, lk, p.compute_dtype)
        self.factor = p.scale / self.cap  # q' = q * factor: q' k^T = scale q k^T / cap
        self.slope = self.cap * LOG2E  # exp(cap tanh - s) = exp2(slope tanh - s log2(e))
        self.rows = max(1, min(lq, sizes[0]))
        self.cols = max(1, min(lk, sizes[1] // max(1, batch * heads * self.rows)))
        self.bounded = False  # see bound()

    def bound(self, q, k) -> None:
        """Set ``bounded`` when ``|q_i . k_j| factor <= PADE_LIMIT`` for every pair (Cauchy-Schwarz on row norms).

        Then no block needs its own range check before :func:`tanh_`.
        """
        norms = (q.norm(dim=-1).amax() * k.norm(dim=-1).amax()) if q.numel() and k.numel() else q.new_zeros(())
        self.bounded = bool(norms * abs(self.factor) <= PADE_LIMIT)

    def row_slabs(self):
        lq = self.p.sizes[2]
        return [(s, min(lq, s + self.rows)) for s in range(0, lq, self.rows)]

    def key_blocks(self):
        lk = self.p.sizes[3]
        return [(s, min(lk, s + self.cols)) for s in range(0, lk, self.cols)]

    def allowed(self, rs, re, ks, ke, device):
        """Bool ``allowed`` of a block (None without a mask)."""
        p = self.p
        if p.mask is None:
            return None
        batch, heads, lq, lk, _, _ = p.sizes
        return p.mask.allows(*dense_indices(batch, heads, rs, re, ks, ke, device), lq, lk)

    @staticmethod
    def offset(shift):
        """``-shift * log2(e)``, what :meth:`weights` adds to ``slope * tanh`` (``shift`` a float or a tensor)."""
        return shift * -LOG2E

    def weights(self, qs, kt, rs, re, ks, ke, offset, ws: Workspace, keep_tanh=False):
        """``exp(cap * tanh(qs kt) - shift)`` of a block, 0 where masked; ``(weights, tanh)`` if ``keep_tanh``.

        ``qs`` is ``q * factor`` (the block's rows), ``offset`` a 0-dim tensor or one
        per row ``(B, H, rows, 1)`` from :meth:`offset`. The block lives in ``ws``
        (buffers reused by every block); without ``keep_tanh`` the weights overwrite the tanh.
        """
        shape = (*qs.shape[:3], ke - ks)
        t = tanh_(torch.matmul(qs, kt[..., ks:ke], out=ws.take("tanh", *shape)), ws, self.bounded)  # (B, H, rows, keys)
        e = torch.add(offset, t, alpha=self.slope, out=ws.take("weights", *shape) if keep_tanh else t).exp2_()
        allowed = self.allowed(rs, re, ks, ke, qs.device)
        e = e if allowed is None else e.masked_fill_(~allowed, 0.0)
        return (e, t) if keep_tanh else e

    def forward(self, q, k, v):
        """``(out, lse)`` in the compute dtype."""
        kt, ws = k.transpose(-1, -2), Workspace(q)
        qs = q * self.factor
        self.bound(q, k)
        offset = q.new_tensor(self.offset(self.c))
        outs, lses = [], []
        for rs, re in self.row_slabs():
            acc = l = None
            for ks, ke in self.key_blocks():
                e = self.weights(qs[:, :, rs:re], kt, rs, re, ks, ke, offset, ws)
                part, total = e @ v[:, :, ks:ke], e.sum(-1, keepdim=True)
                acc, l = (part, total) if acc is None else (acc.add_(part), l.add_(total))
            l_safe, lse = guard_empty_rows(torch.full_like(l, self.c), l)
            outs.append(acc.div_(l_safe))
            lses.append(lse)
        return torch.cat(outs, 2), torch.cat(lses, 2)


def describe(p: Problem) -> str:
    c = shift(p.modifier.cap, p.sizes[3], p.compute_dtype)
    return f"soft-capping with a fixed shift {c:g} instead of a running max"


def backward_differentiable(p: Problem) -> bool:
    """Its backward is written by hand: a second derivative recomputes the call (pipeline.twice_differentiable)."""
    return False


def run(p: Problem) -> KernelOutput:
    """Out and lse; under autograd through :class:`~.softcap_grad.SoftcapAttention`; sinks join (out, lse)."""
    if p.sinks is not None:
        inner = without_sinks(p)
        return join_sinks(p, inner, run(inner))
    q, k, v = upcast_inputs(p)
    blocks = Blocks(p)
    if p.needs_grad:
        out, lse = SoftcapAttention.apply(blocks, q, k, v)
    else:
        out, lse = blocks.forward(q, k, v)
    return KernelOutput(out, None, lse)


def cost(p: Problem, grad: bool = False) -> PathCost:
    """Both products over every pair, block by block; the backward recomputes each block from the lse."""
    b, h, lq, lk, d, dv = p.sizes
    pairs = b * h * lq * lk
    return PathCost(pairs, 3.0 * min(pairs, FORWARD_BLOCKS[1]) * itemsize(p),
                    fused=fused_attention("attention (soft-cap loop, fixed shift)", pairs, d, dv), materialized=False)
