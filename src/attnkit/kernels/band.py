"""Path ``band-windows``: band attention without gathers: each query block reads one contiguous window of keys.

For a mask that allows exactly the keys ``lo <= j - i <= hi`` (a sliding window,
or a window intersected with causal), query block ``I`` (rows ``I*bs .. I*bs+bs-1``)
needs the keys ``I*bs + lo .. I*bs + bs - 1 + hi``: ``W = bs + hi - lo`` of them,
contiguous in K and V. So the windows of a run of blocks are one ``as_strided``
view of K (a stride of ``bs`` rows) and the scores of the run are one ``bmm``:
no gathered copies of K or V, forward or backward. Inside a window the mask is
the same ``(bs, W)`` band for every block, and only its two ``(bs, bs)`` corners
hold masked entries. The few edge blocks (window past either end of the keys, or
rows past ``Lq``) get zero-padded copies and their exact mask (:mod:`.band_blocks`).

Rows are normalised whole by torch's fused softmax (in place), so the backward
(Dao 2023, arXiv:2307.08691, Alg. 2, written by hand) recomputes the same
probabilities without a saved log-sum-exp, and adds the key and value gradients
of overlapping windows back block by block; sinks join the output and lse after the
windows (:func:`.pipeline.without_sinks`, :func:`.pipeline.join_sinks`), and the backward takes the lse gradient that
hands it. Work is ``O(Lq W D)``; extra memory is one slab of scores (``SLAB``
elements) and the output.

bfloat16/float16 inputs run in float32 unless the CPU has matmul units for them
(:func:`attnkit.runtime.low_precision_math`); then the products with V, dO and dS
are half-precision ``bmm`` (about 2.4x float32's speed with AVX-512-BF16), the
forward's scores and softmax are float32 (the probabilities rounded once), the
backward recomputes them in the half dtype (torch's softmax sums in float32), and
the key and value gradients of overlapping windows add up in float32.
"""

from __future__ import annotations

import functools

import torch
from torch.autograd.function import once_differentiable

from ..functional.validate import Problem
from ..runtime import low_precision_math
from . import band_blocks as ws
from . import rules
from .path_cost import PathCost, fused_attention, itemsize
from .pipeline import KernelOutput, Workspace, for_many_operators, join_sinks, without_sinks

__all__ = ["REFUSALS", "refusal", "plan", "run", "forward", "backward", "describe", "cost", "density", "op_forward",
           "op_backward"]

BLOCK_SIZES = (32, 64, 128)
_NEG_INF = float("-inf")


REFUSALS = (rules.full_precision_kv,
            rules.not_compiling, rules.no_weights, rules.softmax_of_dot_products, rules.no_bias, rules.no_dropout,
            rules.bounded_band)


def refusal(p: Problem) -> str | None:
    """Why the band path cannot compute this problem exactly (None: it can)."""
    return rules.first_refusal(p, REFUSALS)


def plan(p: Problem) -> ws.Plan:
    """The block size with the fewest computed scores, small blocks paying a per-block overhead.

    The dispatcher's density and the run read it in one call: it is computed once per band and sizes.
    """
    _, _, lq, lk, _, _ = p.sizes
    best = _best_plan.__wrapped__ if torch.compiler.is_compiling() else _best_plan  # dynamo skips the cache anyway
    return best(*p.band, lq, lk, BLOCK_SIZES)  # BLOCK_SIZES read at call time (tests change it)


@functools.lru_cache(maxsize=64)
def _best_plan(lo: int, hi: int, lq: int, lk: int, block_sizes: tuple[int, ...]) -> ws.Plan:
    best, best_cost = None, None
    for bs in block_sizes:  # a plain loop: torch.compile traces this (not min() with a key)
        pl = ws.make_plan(bs, lo, hi, lq, lk)
        cost = pl.nq * pl.bs * pl.width * (1 + 16 / pl.bs)
        if best is None or cost < best_cost:
            best, best_cost = pl, cost
    return best


def _low(t: torch.Tensor) -> bool:
    """Whether the kernel computes in bfloat16/float16 (native matmul units: attnkit.runtime.low_precision_math)."""
    return t.dtype in (torch.bfloat16, torch.float16)


class _Buffers(Workspace):
    """The slab buffers in the kernel's dtype, and float32 ones beside them (half-precision scores)."""

    def __init__(self, like: torch.Tensor):
        super().__init__(like)
        self.f32 = Workspace(like.new_empty(0, dtype=torch.float32))


def _transposed(t: torch.Tensor, dtype: torch.dtype):
    """``(N, E, Lk)`` copy in ``dtype`` of half-precision keys or values ``(N, Lk, E)``, else None.

    torch's half-precision ``bmm`` copies a transposed window that overlaps the next one
    (``as_strided`` with a stride of ``bs`` rows) before multiplying, which doubled the
    score products; a window of the transposed copy is a plain strided operand.
    """
    return t.transpose(1, 2).to(dtype).contiguous() if _low(t) else None


def _window_t(sl: ws.Slab, window: torch.Tensor, t_t: torch.Tensor | None) -> torch.Tensor:
    """The slab's window ``(n, W, E)`` transposed, ``(n, E, W)``, in ``t_t``'s dtype: a view of ``t_t``
    (:func:`_transposed`) for a run."""
    if t_t is None or not sl.run:
        return window.transpose(1, 2) if t_t is None else window.transpose(1, 2).to(t_t.dtype)
    pl = sl.pl
    rows = t_t[sl.n0]  # (E, Lk)
    return rows.as_strided((sl.i1 - sl.i0, rows.shape[0], pl.width), (pl.bs, rows.stride(0), 1),
                           rows.storage_offset() + sl.i0 * pl.bs + pl.lo)


def _probs(work: _Buffers, sl: ws.Slab, scale: float, need_max: bool = False, kt=None):
    """``(q * scale, probabilities (n, bs, W), them in the kernel's dtype, row max of the scores or None)``
    of a slab, in the workspace.

    ``kt`` (:func:`_transposed`) for half-precision slabs: in float32, the scores and softmax are float32
    and the probabilities are rounded once for the product with V; in the half dtype, the scores are
    rounded by the product and torch's softmax computes in float32 and rounds its output.
    """
    qs = torch.mul(sl.q, scale, out=work.take("q", *sl.q.shape))  # (n, bs, D): scaling the small operand
    shape = (*sl.q.shape[:2], sl.k.shape[1])
    if kt is not None and kt.dtype != qs.dtype:
        q32 = torch.mul(sl.q, scale, out=work.f32.take("q", *sl.q.shape))
        s = torch.bmm(q32, _window_t(sl, sl.k, kt), out=work.f32.take("s", *shape))  # (n, bs, W)
    else:
        s = torch.bmm(qs, _window_t(sl, sl.k, kt), out=work.take("s", *shape))
    sl.mask_(s, _NEG_INF)
    m = s.amax(-1) if need_max else None
    torch.ops.aten._softmax.out(s, -1, False, out=s)  # fused and in place; no slow exp(-inf) path
    sl.zero_empty_rows_(s)  # rows with no key (edge blocks only): softmax gave NaN, the output is 0
    return qs, s, (s if s.dtype == qs.dtype else work.take("p", *shape).copy_(s)), m


def _forward(q, k, v, pl: ws.Plan, scale: float, need_lse: bool):
    """Output ``(N, G, Lq, Dv)`` and lse ``(N, G, Lq)`` (or None) over every slab."""
    out = q.new_empty(*q.shape[:3], v.shape[2])
    lse = q.new_empty(q.shape[:3]) if need_lse else None
    work, kt = _Buffers(q), _transposed(k, torch.float32)  # half precision: float32 scores, the output's
    with for_many_operators():  # a few operators per slab: one thread on an oversubscribed machine
        for sl in ws.slabs(q, k, v, pl, out, lse):
            _, probs, pv, m = _probs(work, sl, scale, need_lse, kt)
            sl.write_out(torch.bmm(pv, sl.v, out=sl.out_buffer(work)))
            if need_lse:  # the largest probability is exp(0) / sum: lse = m + log(sum)
                sl.write_lse(sl.fill_empty_rows(m - torch.log(probs.amax(-1)), _NEG_INF))
    return out, lse


def _backward(q, k, v, out, dout, dlse, pl: ws.Plan, scale: float, finite: bool):
    low = _low(q)  # native half matmuls: float32 sums and window gradients
    delta = (dout.float() * out.float()).sum(-1) if low else (dout * out).sum(-1)  # (N, G, Lq): rowsum(dO * O)
    if dlse is not None:
        delta = delta - dlse  # d lse / d s = P: the same term
    acc = torch.float32 if low else k.dtype
    dq, dk, dv = torch.empty_like(q), torch.zeros_like(k, dtype=acc), torch.zeros_like(v, dtype=acc)
    work, kt, vt = _Buffers(q), _transposed(k, q.dtype), _transposed(v, q.dtype)  # half: half scores
    with for_many_operators():
        for sl in ws.slabs(q, k, v, pl, dq, None, dout=dout, delta=delta):
            qs, probs, pv, _ = _probs(work, sl, scale, kt=kt)
            if not finite:
                sl.mask_(probs, 0.0)  # a NaN row must not reach keys it does not attend
            window = (probs.shape[0], probs.shape[2])
            dkv = work.take("dkv", *window, dv.shape[-1])
            sl.add_window(dv, torch.bmm(pv.transpose(1, 2), sl.dout, out=dkv))
            ds = torch.bmm(sl.dout, _window_t(sl, sl.v, vt), out=work.take("ds", *probs.shape))
            ds.sub_(sl.delta[..., None]).mul_(probs)
            if not finite:
                sl.mask_(ds, 0.0)  # select: 0 * NaN from a masked value cannot leak
            sl.write_out(torch.bmm(ds, sl.k, out=sl.out_buffer(work)))
            sl.add_window(dk, torch.bmm(ds.transpose(1, 2), qs, out=work.take("dkv", *window, dk.shape[-1])))
    return dq.mul_(scale), dk.to(k.dtype), dv.to(v.dtype)


def _grouped(q, k, v):
    """``(B, H, L, E)`` views as ``(N, G, Lq, D)`` queries and ``(N, Lk, E)`` keys and values (``N = B*H_kv``)."""
    batch, heads, lq, d = q.shape
    hkv = k.shape[1]
    return (q.view(batch * hkv, heads // hkv, lq, d), k.view(batch * hkv, *k.shape[2:]),
            v.view(batch * hkv, *v.shape[2:]))


def forward(q, k, v, pl: ws.Plan, scale: float, need_lse: bool):
    """Out ``(B, H, Lq, Dv)`` and lse ``(B, H, Lq)`` (or None) of contiguous ``(B, H, L, E)`` inputs."""
    q3, k3, v3 = _grouped(q, k, v)
    out, lse = _forward(q3, k3, v3, pl, scale, need_lse)
    return out.view(*q.shape[:3], -1), (lse.view(q.shape[:3]) if need_lse else None)


def backward(q, k, v, out, dout, dlse, pl: ws.Plan, scale: float, finite: bool):
    """``dq, dk, dv`` shaped like ``q, k, v`` from the forward's output (no saved lse: probabilities recomputed)."""
    q3, k3, v3 = _grouped(q, k, v)
    out3 = out.reshape(*q3.shape[:3], -1)
    dout3 = dout.reshape(out3.shape).contiguous()
    dlse3 = dlse.reshape(out3.shape[:3]) if dlse is not None and dlse.numel() else None
    dq, dk, dv = _backward(q3, k3, v3, out3, dout3, dlse3, pl, scale, finite)
    return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)


class _BandAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, pl: ws.Plan, scale: float, finite: bool, need_lse: bool):
        out, lse = forward(q, k, v, pl, scale, need_lse)
        ctx.save_for_backward(q, k, v, out)
        ctx.pl, ctx.scale, ctx.finite = pl, scale, finite
        return out, (lse if need_lse else out.new_empty(0))

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, dlse):
        q, k, v, out = ctx.saved_tensors
        return (*backward(q, k, v, out, dout, dlse, ctx.pl, ctx.scale, ctx.finite), None, None, None, None)


def density(p: Problem) -> float:
    """The fraction of the ``Lq x Lk`` scores the window blocks compute."""
    pl = plan(p)
    return pl.nq * pl.bs * pl.width / (p.sizes[2] * p.sizes[3])


def describe(p: Problem) -> str:
    pl = plan(p)
    return f"band windows of {pl.width} keys per block of {pl.bs} queries, read in place (no gathers)"


def backward_differentiable(p: Problem) -> bool:
    """Its backward is written by hand: a second derivative recomputes the call (pipeline.twice_differentiable)."""
    return False


def run(p: Problem) -> KernelOutput:
    """Out ``(B, H, Lq, Dv)`` and lse ``(B, H, Lq)`` or None, in the compute dtype; sinks join (out, lse)."""
    if p.sinks is not None:
        inner = without_sinks(p)
        return join_sinks(p, inner, run(inner))
    dt = p.compute_dtype  # half inputs: natively where the CPU has units for them (then no lse), else float32
    if _low(p.q) and not p.return_lse:
        dt = low_precision_math(p.q.dtype, p.q.device)
    q, k, v = (t.to(dt).contiguous() for t in (p.q, p.k, p.v))
    finite = p.inputs_finite() if p.needs_grad else True  # only the backward reads it
    out, lse = _BandAttention.apply(q, k, v, plan(p), p.scale, finite, p.return_lse)
    return KernelOutput(out, None, lse if p.return_lse else None)


def _kernel_inputs(p: Problem):
    dt = p.compute_dtype
    return tuple(t.to(dt).contiguous() for t in (p.q, p.k, p.v))


def op_forward(p: Problem):
    """For the compiled operator: ``(out, None)``; the backward recomputes the probabilities, no lse saved."""
    return forward(*_kernel_inputs(p), plan(p), p.scale, False)[0], None


def op_backward(p: Problem, out, saved, dout):
    """For the compiled operator: ``dq, dk, dv`` (key/value heads as given)."""
    return backward(*_kernel_inputs(p), out, dout, None, plan(p), p.scale, p.inputs_finite())


def cost(p: Problem, grad: bool = False) -> PathCost:
    """A ``bs x W`` window of scores per query block; the backward recomputes the probabilities."""
    b, h, _, _, d, dv = p.sizes
    pl = plan(p)
    pairs = b * h * pl.nq * pl.bs * pl.width
    return PathCost(pairs, 3.0 * min(pairs, ws.SLAB) * itemsize(p),
                    fused=fused_attention("attention (band windows)", pairs, d, dv), materialized=False)
