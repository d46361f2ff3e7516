"""Path ``softcap-loop``: soft-capped attention without a running maximum.

``softmax(cap * tanh(scale * q k^T / cap)) v``.

Soft-capping (Gemma 2, arXiv:2408.00118) bounds every score to ``[-cap, cap]``,
so the softmax needs no row maximum: with one fixed shift ``c`` per problem,
``exp(cap * tanh(.) - c)`` neither overflows (summed over ``Lk`` keys) nor
underflows (the largest entry of a row stays a normal float) when
``2 cap + log(Lk)`` fits the dtype's exponent range (``cap`` up to about 80 in
float32). Softmax is shift-invariant, so the result is exact; the online-softmax
rescaling of :mod:`.online_softmax` disappears and each block of
``(heads, rows, keys)`` costs one ``bmm``, the capped exponent, ``exp2`` (in place),
a row sum and a ``bmm`` with V::

    e = exp2(log2(e) * (cap * tanh(q' k^T) - c))   with q' = q * scale / cap
    out = (sum_blocks e V) / (sum_blocks rowsum(e));   lse = log(sum rowsum(e)) + c

``tanh`` was most of the elementwise cost (torch's is about 2.6-3.2 ns an element on
one core, an add or a multiply 0.1 ns). In float32 a block whose arguments ``x`` all
lie in ``[-a, a]`` uses the cheapest approximant that is float32-exact there (a few
ulp, like the rounding of the product it follows): ``tanh(x) = x R(x^2)`` with ``R`` a
polynomial of degree 3 to 6 for ``a`` up to 0.35, 0.5, 0.7 and 1 (:data:`POLYNOMIALS`),
the [7/6] Pade approximant up to 2, ``torch.tanh`` beyond, for NaN and for other dtypes.
In the forward the slope ``cap log2(e)`` is folded into the coefficients and the shift
into the last pass, so the exponent of a degree-``n`` block is ``n + 2`` passes
(``x^2``, Horner's rule, then ``offset + x R``); ``exp2`` and the row sum make ``n + 4``.
The range comes from Cauchy-Schwarz on the row norms when that already reaches the
cheapest approximant (no check per block), else from one ``aminmax`` pass per block.
Scores of soft-capped models sit mostly well inside the cap (``|x| = |score| / cap``),
so most blocks take a low degree.
``tanh(x) = 2 sigmoid(2x) - 1`` is cheaper than torch's tanh but was measured and
dropped: ``sigmoid`` is near 1/2 where ``tanh`` is near 0, so the score would carry an
absolute error of about ``cap * eps`` instead of ``eps * |score|``, 2-5x the plain
float32 error at cap 50, beyond the DESIGN.md tolerance.

Blocks are 2^18 scores (1 MiB in float32) of 256 query rows x 256 keys x as many
heads as fit: larger matmuls than the 128 x 256 blocks over every head this path had
before, and the same few buffers reused by every block (in cache).

Under autograd a custom backward (:mod:`.softcap_grad`) recomputes each block
from the saved ``lse``; nothing of size ``Lq x Lk`` is kept.
"""

from __future__ import annotations

import functools
import math

import torch

from ..bias import Softcap
from ..functional.normalize import guard_empty_rows
from ..functional.validate import Problem
from . import rules
from .path_cost import PathCost, fused_attention, itemsize
from .pipeline import KernelOutput, Workspace, dense_indices, join_sinks, upcast_inputs, without_sinks
from .softcap_grad import SoftcapAttention

__all__ = ["refusal", "run", "shift", "describe", "Blocks", "tanh_", "capped_", "approximant"]

# (query rows, keys, score elements) per block: a block is (heads, rows, keys) with as many heads as the
# elements allow. At 1 thread, L = 4096, B*H = 8, forward against SDPA's unbiased time (thread CPU time,
# medians of 5 interleaved rounds): 128 rows x 256 keys x 8 heads 1.43x, 256 x 256 x 4 1.32x, 128 x 256 x 1 1.62x.
FORWARD_BLOCKS = (256, 256, 1 << 18)

LOG2E = 1.0 / math.log(2.0)

# R(u) = tanh(x) / x, u = x^2, by polynomials (coefficients constant first): each interpolates R at the degree + 1
# Chebyshev nodes of [0, a^2] (computed in float64 with numpy's polyfit), which is within 4e-8 of R there
# (1.3e-8 to 5e-8 by degree); evaluated in float32, x R(x^2) is within 2.6 ulp of tanh on [-a, a]
# (tests/kernels/test_perf_elementwise.py measures it). (a, coefficients), cheapest first.
POLYNOMIALS = (
    (0.35, (0.9999999650994778, -0.3333242023178473, 0.13295751554678248, -0.048955637142440236)),
    (0.5, (0.9999999867573897, -0.3333306794442269, 0.13324750504796448, -0.05298423882912098,
           0.017131344432951473)),
    (0.7, (0.9999999860734116, -0.3333312813332503, 0.13328377893090845, -0.0535239177415844,
           0.020019607076243638, -0.0050843935116284865)),
    (1.0, (0.9999999486455697, -0.33332827978599144, 0.13325076146099293, -0.053451646369593195,
           0.020279708285291156, -0.006194324833293684, 0.001038025096577805)),
)

# tanh(x) = x P(x^2) / Q(x^2): the [7/6] Pade approximant, i.e. Lambert's continued fraction
# x / (1 + x^2 / (3 + x^2 / (5 + ... + x^2 / 13))) multiplied out; its relative error is under 1.2e-8
# for |x| <= 2; evaluated in float32 it is within 3.6 ulp of tanh (3.54 at x = 1.5631, the worst of every 37th
# float32 in [0, 2]; tests/kernels/test_perf_elementwise.py). Coefficients of P and Q, constant term first.
PADE_P = (1.0, 17325 / 135135, 378 / 135135, 1 / 135135)
PADE_Q = (1.0, 62370 / 135135, 3150 / 135135, 28 / 135135)
PADE_LIMIT = 2.0
PADE = "pade"


def approximant(limit: float, dtype: torch.dtype = torch.float32):
    """What computes ``tanh`` where ``|x| <= limit``: a polynomial's coefficients, :data:`PADE` or None
    (``torch.tanh``: beyond 2, NaN, or not float32)."""
    if dtype != torch.float32:
        return None
    for a, coeffs in POLYNOMIALS:
        if limit <= a:
            return coeffs
    return PADE if limit <= PADE_LIMIT else None


def block_range(x: torch.Tensor) -> float:
    """``max |x|`` of a block (NaN if it holds a NaN), one pass."""
    lo, hi = torch.aminmax(x)
    return torch.maximum(-lo, hi).item()


@functools.lru_cache(maxsize=64)
def _constants(coeffs: tuple, scale: float, dtype: torch.dtype, device: torch.device) -> tuple:
    """``scale * c`` for all but the last coefficient, as 0-dim tensors (made once, not for every block)."""
    return tuple(torch.tensor(c * scale, dtype=dtype, device=device) for c in coeffs[:-1])


def _poly_(out, u, coeffs, scale: float):
    """``out = scale * (c0 + c1 u + ... + cn u^n)`` by Horner's rule, one fused pass a degree (``out`` is not ``u``)."""
    c = _constants(coeffs, scale, u.dtype, u.device)
    torch.add(c[-1], u, alpha=coeffs[-1] * scale, out=out)
    for ci in c[-2::-1]:
        torch.addcmul(ci, out, u, out=out)
    return out


def capped_(x, ws: Workspace, offset, slope: float, kind, keep_tanh: bool = False):
    """``(slope * tanh(x) + offset, tanh(x) or None)`` of a block; ``x`` is overwritten.

    ``kind`` is :func:`approximant`'s answer for the block. Without ``keep_tanh`` the
    result is written over ``x`` and the slope and offset are folded into the approximant's
    last passes; with it, ``x`` holds ``tanh(x)`` and the result is a workspace buffer.
    """
    if kind is None:
        t = x.tanh_()
    else:
        u = torch.mul(x, x, out=ws.take("tanh_u", *x.shape))
        if kind is PADE:
            p = _poly_(ws.take("tanh_p", *x.shape), u, PADE_P, 1.0).mul_(x)
            q = _poly_(ws.take("tanh_q", *x.shape), u, PADE_Q, 1.0)
            if not keep_tanh:
                return torch.addcdiv(offset, p, q, value=slope, out=x), None
            t = torch.div(p, q, out=x)
        else:
            if not keep_tanh:
                return torch.addcmul(offset, x, _poly_(ws.take("tanh_p", *x.shape), u, kind, slope), out=x), None
            t = x.mul_(_poly_(ws.take("tanh_p", *x.shape), u, kind, 1.0))
    if not keep_tanh:
        return torch.add(offset, t, alpha=slope, out=t), None
    return torch.add(offset, t, alpha=slope, out=ws.take("weights", *x.shape)), t


def tanh_(x, ws: Workspace, limit: float | None = None):
    """``tanh`` of a block in place, by the approximant its range admits (``limit``: a known bound on ``|x|``,
    else measured), exactly as the backward computes it."""
    if x.numel() == 0:
        return x
    kind = approximant(block_range(x) if limit is None else limit, x.dtype)
    return capped_(x, ws, x.new_zeros(()), 1.0, kind, keep_tanh=True)[1]


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


def _spans(length: int, step: int):
    return [(s, min(length, s + step)) for s in range(0, length, step)]


class Blocks:
    """Blocks of ``(heads, rows, keys)`` of a problem, the mask of each block, and the weights of a block.

    Tensors are ``(N, L, E)`` views of the ``(B, H, L, E)`` inputs, ``N = B * H``.
    """

    def __init__(self, p: Problem, sizes: tuple[int, int, int] | None = None):
        batch, heads, lq, lk, _, _ = p.sizes
        rows, keys, elements = FORWARD_BLOCKS if sizes is None else sizes  # read at call time (tests shrink it)
        self.p, self.cap = p, p.modifier.cap
        self.c = shift(self.cap, lk, p.compute_dtype)
        self.factor = p.scale / self.cap  # q' = q * factor: q' k^T = scale q k^T / cap
        self.slope = self.cap * LOG2E  # exp(cap tanh - s) = exp2(slope tanh - s log2(e))
        self.rows = max(1, min(lq, rows))
        self.cols = max(1, min(lk, keys))
        self.heads = max(1, min(batch * heads, elements // (self.rows * self.cols)))
        self.kind: object = False  # False: measure each block; see bound()

    def bound(self, q, k) -> None:
        """Fix the approximant for every block when Cauchy-Schwarz on the row norms puts ``|q_i . k_j| factor``
        within the cheapest one's range (then no block is measured); a NaN norm never vouches."""
        if q.dtype != torch.float32:
            self.kind = None  # torch.tanh, unmeasured
            return
        norms = (q.norm(dim=-1).amax() * k.norm(dim=-1).amax()) if q.numel() and k.numel() else q.new_zeros(())
        self.kind = POLYNOMIALS[0][1] if (norms * abs(self.factor)).item() <= POLYNOMIALS[0][0] else False

    def head_spans(self):
        batch, heads = self.p.sizes[:2]
        return _spans(batch * heads, self.heads)

    def row_slabs(self):
        return _spans(self.p.sizes[2], self.rows)

    def key_blocks(self):
        return _spans(self.p.sizes[3], self.cols)

    def allowed(self, n0, n1, rs, re, ks, ke, device):
        """Bool ``allowed`` of a block, broadcastable to ``(n1 - n0, rows, keys)`` (None without a mask)."""
        p = self.p
        if p.mask is None:
            return None
        batch, heads, lq, lk, _, _ = p.sizes
        m = p.mask.allows(*dense_indices(batch, heads, rs, re, ks, ke, device), lq, lk)
        if m.shape[0] == 1 and m.shape[1] == 1:
            return m[0, 0]
        return m.expand(batch, heads, *m.shape[2:]).reshape(batch * heads, *m.shape[2:])[n0:n1]

    @staticmethod
    def offset(shift):
        """``-shift * log2(e)``, what :meth:`weights` adds to ``slope * tanh`` (``shift`` a float or a tensor)."""
        return shift * -LOG2E

    def weights(self, qs, kt, n0, n1, rs, re, ks, ke, offset, ws: Workspace, keep_tanh=False):
        """``exp(cap * tanh(qs kt) - shift)`` of a block, 0 where masked; ``(weights, tanh or None)``.

        ``qs`` is ``q * factor``, ``(n1 - n0, rows, D)``, and ``kt`` the block's keys transposed;
        ``offset`` a 0-dim tensor or one per row ``(n, rows, 1)`` from :meth:`offset`. The block
        lives in ``ws`` (buffers reused by every block).
        """
        x = torch.bmm(qs, kt, out=ws.take("tanh", *qs.shape[:2], kt.shape[-1]))  # (n, rows, keys)
        kind = self.kind
        if kind is False:
            kind = approximant(block_range(x)) if x.numel() else None
        e, t = capped_(x, ws, offset, self.slope, kind, keep_tanh)
        e.exp2_()
        allowed = self.allowed(n0, n1, rs, re, ks, ke, qs.device)
        return (e if allowed is None else e.masked_fill_(~allowed, 0.0)), t

    def forward(self, q, k, v):
        """``(out, lse)`` in the compute dtype, of ``(B, H, L, E)`` inputs."""
        batch, heads, lq, lk, d, dv = self.p.sizes
        n = batch * heads
        q3, k3, v3 = q.reshape(n, lq, d), k.reshape(n, lk, d), v.reshape(n, lk, dv)
        kt, ws = k3.transpose(1, 2), Workspace(q)
        qs = q3 * self.factor
        self.bound(q, k)
        offset = q.new_tensor(self.offset(self.c))
        out, total = q.new_empty(n, lq, dv), q.new_zeros(n, lq, 1)
        for n0, n1 in self.head_spans():
            for rs, re in self.row_slabs():
                acc, l = out[n0:n1, rs:re], total[n0:n1, rs:re]
                for i, (ks, ke) in enumerate(self.key_blocks()):
                    e, _ = self.weights(qs[n0:n1, rs:re], kt[n0:n1, :, ks:ke], n0, n1, rs, re, ks, ke, offset, ws)
                    if i == 0:
                        torch.bmm(e, v3[n0:n1, ks:ke], out=acc)
                    else:
                        torch.baddbmm(acc, e, v3[n0:n1, ks:ke], out=acc)
                    l.add_(e.sum(-1, keepdim=True))
        if lk == 0:
            out.zero_()
        l_safe, lse = guard_empty_rows(torch.full_like(total, self.c), total)
        return out.div_(l_safe).view(batch, heads, lq, dv), lse.view(batch, heads, lq)


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
    return PathCost(pairs, 3.0 * min(pairs, FORWARD_BLOCKS[2]) * itemsize(p),
                    fused=fused_attention("attention (soft-cap loop, fixed shift)", pairs, d, dv), materialized=False)
