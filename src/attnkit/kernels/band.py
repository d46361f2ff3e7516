"""Path ``band-windows``: band attention without gathers: each query block reads one contiguous window of keys.

For a mask that allows exactly the keys ``lo <= j - i <= hi`` (a sliding window,
or a window intersected with causal), query block ``I`` (rows ``I*bs .. I*bs+bs-1``)
needs the keys ``I*bs + lo .. I*bs + bs - 1 + hi``: ``W = bs + hi - lo`` of them,
contiguous in K and V. So the windows of a run of blocks are one ``as_strided``
view of K (a stride of ``bs`` rows) and the scores of the run are one ``bmm``:
no gathered copies of K or V, forward or backward. Inside a window the mask is
the same ``(bs, W)`` band for every block, and only its two ``(bs, bs)`` corners
hold masked entries. The few edge blocks (window past either end of the keys, or
rows past ``Lq``) get zero-padded copies and their exact mask (the slabs, below).

Rows are normalised whole by torch's fused softmax (in place), so the backward
(Dao 2023, arXiv:2307.08691, Alg. 2, written by hand) recomputes the same
probabilities without a saved log-sum-exp, and adds the key and value gradients
of overlapping windows back block by block; sinks join the output and lse after the
windows (:func:`.pipeline.without_sinks`, :func:`.pipeline.join_sinks`), and the backward takes the lse gradient that
hands it. Work is ``O(Lq W D)``; extra memory is one slab of scores (``SLAB``
elements) and the output.

The slabs (the second half of this file) are views of Q, K, V, never gathers.

Tensors are ``(N, G, Lq, .)`` for queries (``N = B * H_kv`` key/value heads, ``G``
query heads per key/value head) and ``(N, Lk, .)`` for keys and values. A slab is
a batch of query blocks that one ``bmm`` computes against their key windows:

- a run of interior blocks of one head: windows are one ``as_strided`` view of K;
- one interior block of a run of heads: windows are a slice of K;
- one edge block (window past either end of the keys, or rows past ``Lq``) of a run
  of heads: zero-padded copies and the block's exact mask.

Interior blocks share one mask, the band, whose masked entries sit in the two
``(bs, bs)`` corners of the ``(bs, W)`` window; every interior row has a key.

bfloat16/float16 inputs run in float32 unless the CPU has matmul units for them
(:func:`attnkit.runtime.low_precision_math`); then the products with V, dO and dS
are half-precision ``bmm`` (about 2.4x float32's speed with AVX-512-BF16), the
scores and softmax are float32 (the probabilities rounded once for the products),
in the backward as in the forward (recomputed from half-precision scores, a
probability of a score near 100 was off by up to 25 %), and the key and value
gradients of overlapping windows add up in float32.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from ..functional.validate import Problem
from ..runtime import low_precision_math
from . import rules
from .path_cost import PathCost, fused_attention, itemsize
from .pipeline import KernelOutput, Units, Workspace, join_sinks, unit_count, without_sinks

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


def plan(p: Problem) -> Plan:
    """The block size with the fewest computed scores, small blocks paying a per-block overhead.

    The dispatcher's density and the run read it in one call: it is computed once per band and sizes.
    """
    _, _, lq, lk, _, _ = p.sizes
    best = _best_plan.__wrapped__ if torch.compiler.is_compiling() else _best_plan  # dynamo skips the cache anyway
    return best(*p.band, lq, lk, BLOCK_SIZES)  # BLOCK_SIZES read at call time (tests change it)


@functools.lru_cache(maxsize=64)
def _best_plan(lo: int, hi: int, lq: int, lk: int, block_sizes: tuple[int, ...]) -> Plan:
    best, best_cost = None, None
    for bs in block_sizes:  # a plain loop: torch.compile traces this (not min() with a key)
        pl = make_plan(bs, lo, hi, lq, lk)
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


def _window_t(sl: Slab, window: torch.Tensor, t_t: torch.Tensor | None) -> torch.Tensor:
    """The slab's window ``(n, W, E)`` transposed, ``(n, E, W)``, in ``t_t``'s dtype: a view of ``t_t``
    (:func:`_transposed`) for a run."""
    if t_t is None or not sl.run:
        return window.transpose(1, 2) if t_t is None else window.transpose(1, 2).to(t_t.dtype)
    pl = sl.pl
    rows = t_t[sl.n0]  # (E, Lk)
    return rows.as_strided((sl.i1 - sl.i0, rows.shape[0], pl.width), (pl.bs, rows.stride(0), 1),
                           rows.storage_offset() + sl.i0 * pl.bs + pl.lo)


def _probs(work: _Buffers, sl: Slab, scale: float, need_max: bool = False, kt=None):
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


def _units(q, pl: Plan) -> tuple[Units, list[tuple[int, int]]]:
    """The call's units (:class:`.pipeline.Units`): runs of key/value heads ``[a, b)``, whose rows are their own."""
    heads = q.shape[0]
    count = unit_count(heads, q.shape[1] * heads * pl.nq * pl.bs * pl.width)
    return Units(count), [(heads * u // count, heads * (u + 1) // count) for u in range(count)]


def _forward(q, k, v, pl: Plan, scale: float, need_lse: bool):
    """Output ``(N, G, Lq, Dv)`` and lse ``(N, G, Lq)`` (or None) over every slab."""
    out = q.new_empty(*q.shape[:3], v.shape[2])
    lse = q.new_empty(q.shape[:3]) if need_lse else None
    units, heads = _units(q, pl)
    kt = _transposed(k, torch.float32)  # half precision: float32 scores, the output's products in half

    def share() -> None:  # one thread's units, a few operators per slab
        work = _Buffers(q)
        for a, b in (heads[u] for u in units.take()):
            kt_ab = kt[a:b] if kt is not None else None
            for sl in slabs(q[a:b], k[a:b], v[a:b], pl, out[a:b], lse[a:b] if lse is not None else None,
                            call_heads=q.shape[0]):
                _, probs, pv, m = _probs(work, sl, scale, need_lse, kt_ab)
                sl.write_out(torch.bmm(pv, sl.v, out=sl.out_buffer(work)))
                if need_lse:  # the largest probability is exp(0) / sum: lse = m + log(sum)
                    lse_rows = torch.where(m == _NEG_INF, m, m - torch.log(probs.amax(-1)))  # -inf: no term
                    sl.write_lse(sl.fill_empty_rows(lse_rows, _NEG_INF))
    with units.helping(share):
        share()
    return out, lse


def _backward(q, k, v, out, dout, dlse, pl: Plan, scale: float, finite: bool):
    low = _low(q)  # native half matmuls: float32 sums and window gradients
    delta = (dout.float() * out.float()).sum(-1) if low else (dout * out).sum(-1)  # (N, G, Lq): rowsum(dO * O)
    if dlse is not None:
        delta = delta - dlse  # d lse / d s = P: the same term
    acc = torch.float32 if low else k.dtype
    dq, dk, dv = torch.empty_like(q), torch.zeros_like(k, dtype=acc), torch.zeros_like(v, dtype=acc)
    units, heads = _units(q, pl)
    kt, vt = _transposed(k, torch.float32), _transposed(v, q.dtype)  # half: float32 scores, as the forward's

    def share() -> None:  # one thread's units: their key and value rows are their own
        work = _Buffers(q)
        for a, b in (heads[u] for u in units.take()):
            kt_ab, vt_ab = (t[a:b] if t is not None else None for t in (kt, vt))
            for sl in slabs(q[a:b], k[a:b], v[a:b], pl, dq[a:b], None, dout=dout[a:b], delta=delta[a:b],
                            call_heads=q.shape[0]):
                qs, probs, pv, _ = _probs(work, sl, scale, kt=kt_ab)
                if not finite:
                    sl.mask_(probs, 0.0)  # a NaN row must not reach keys it does not attend
                window = (probs.shape[0], probs.shape[2])
                dkv = work.take("dkv", *window, dv.shape[-1])
                sl.add_window(dv[a:b], torch.bmm(pv.transpose(1, 2), sl.dout, out=dkv))
                ds = torch.bmm(sl.dout, _window_t(sl, sl.v, vt_ab), out=work.take("ds", *probs.shape))
                ds.sub_(sl.delta[..., None]).mul_(probs)
                if not finite:
                    sl.mask_(ds, 0.0)  # select: 0 * NaN from a masked value cannot leak
                sl.write_out(torch.bmm(ds, sl.k, out=sl.out_buffer(work)))
                sl.add_window(dk[a:b], torch.bmm(ds.transpose(1, 2), qs, out=work.take("dkv", *window, dk.shape[-1])))
    with units.helping(share):
        share()
    return dq.mul_(scale), dk.to(k.dtype), dv.to(v.dtype)


def _grouped(q, k, v):
    """``(B, H, L, E)`` views as ``(N, G, Lq, D)`` queries and ``(N, Lk, E)`` keys and values (``N = B*H_kv``)."""
    batch, heads, lq, d = q.shape
    hkv = k.shape[1]
    return (q.view(batch * hkv, heads // hkv, lq, d), k.view(batch * hkv, *k.shape[2:]),
            v.view(batch * hkv, *v.shape[2:]))


def forward(q, k, v, pl: Plan, scale: float, need_lse: bool):
    """Out ``(B, H, Lq, Dv)`` and lse ``(B, H, Lq)`` (or None) of contiguous ``(B, H, L, E)`` inputs."""
    q3, k3, v3 = _grouped(q, k, v)
    out, lse = _forward(q3, k3, v3, pl, scale, need_lse)
    return out.view(*q.shape[:3], -1), (lse.view(q.shape[:3]) if need_lse else None)


def backward(q, k, v, out, dout, dlse, pl: Plan, scale: float, finite: bool):
    """``dq, dk, dv`` shaped like ``q, k, v`` from the forward's output (no saved lse: probabilities recomputed)."""
    q3, k3, v3 = _grouped(q, k, v)
    out3 = out.reshape(*q3.shape[:3], -1)
    dout3 = dout.reshape(out3.shape).contiguous()
    dlse3 = dlse.reshape(out3.shape[:3]) if dlse is not None and dlse.numel() else None
    dq, dk, dv = _backward(q3, k3, v3, out3, dout3, dlse3, pl, scale, finite)
    return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)


class _BandAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, pl: Plan, scale: float, finite: bool, need_lse: bool):
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
    return PathCost(pairs, 3.0 * min(pairs, SLAB) * itemsize(p),
                    fused=fused_attention("attention (band windows)", pairs, d, dv), materialized=False)


# ------------------------------------------------------------------ slabs of query blocks: views of Q, K, V
SLAB = 1 << 21  # score elements per slab (8 MiB in float32): few, large ops per call


class Plan(NamedTuple):
    """Block size, band ``lo <= j - i <= hi``, window width ``W``, interior blocks ``[interior_first, stop)``."""

    bs: int
    lo: int
    hi: int
    width: int
    lq: int
    lk: int
    nq: int
    interior_first: int
    interior_stop: int  # the interior blocks are [interior_first, interior_stop)


def make_plan(bs: int, lo: int, hi: int, lq: int, lk: int) -> Plan:
    nq, width = -(-lq // bs), bs + hi - lo
    interior_first = min(nq, max(0, -(lo // bs)))  # blocks whose window starts before key 0
    last_inside = min((lk - lo - width) // bs, lq // bs - 1)  # window ends inside the keys, every row < Lq
    return Plan(bs, lo, hi, width, lq, lk, nq, interior_first, max(interior_first, min(nq, last_inside + 1)))


def _strided_rows(t: torch.Tensor, first: int, count: int, length: int, step: int) -> torch.Tensor:
    """``count`` row windows of a row-major ``(L, E)`` tensor: rows ``first + c*step ..``, ``(count, length, E)``."""
    e = t.shape[-1]
    return t.as_strided((count, length, e), (step * e, e, 1), t.storage_offset() + first * e)


def _padded_rows(t: torch.Tensor, first: int, length: int) -> torch.Tensor:
    """Rows ``first .. first + length - 1`` of ``(n, L, E)``, a view when all exist, else zero-padded."""
    if first >= 0 and first + length <= t.shape[1]:
        return t[:, first:first + length]
    out = t.new_zeros(t.shape[0], length, t.shape[2])
    lo, hi = max(0, first), min(t.shape[1], first + length)
    if hi > lo:
        out[:, lo - first:hi - first] = t[:, lo:hi]
    return out


class Slab:
    """Blocks ``i`` (``[i0, i1)`` of head ``n0``, or block ``i0`` of heads ``[n0, n1)``) of query group ``g``."""

    def __init__(self, pl: Plan, g: int, n0: int, n1: int, i0: int, i1: int, tensors, edge_mask=None):
        q, k, v, out, lse, dout, delta = tensors
        self.pl, self.g, self.n0, self.n1, self.i0, self.i1 = pl, g, n0, n1, i0, i1
        self.edge_mask, self.out_t, self.lse_t = edge_mask, out[:, g], (lse[:, g] if lse is not None else None)
        self.run = n1 - n0 == 1 and edge_mask is None
        self.rows = min(pl.bs, pl.lq - i0 * pl.bs)  # real rows of the (last) block
        self.q = self._query_rows(q[:, g])
        self.k, self.v = (self._window(t) for t in (k, v))
        self.dout = self._query_rows(dout[:, g]) if dout is not None else None
        self.delta = self._query_rows(delta[:, g, :, None])[..., 0] if delta is not None else None
        if edge_mask is not None:
            self.empty_rows = edge_mask.all(-1, keepdim=True)  # (bs, 1)
            self.has_empty = bool(self.empty_rows.any())

    def _query_rows(self, t):
        pl = self.pl
        if self.run:
            return _strided_rows(t[self.n0], self.i0 * pl.bs, self.i1 - self.i0, pl.bs, pl.bs)
        return _padded_rows(t[self.n0:self.n1], self.i0 * pl.bs, pl.bs)

    def _window(self, t):
        pl = self.pl
        if self.run:
            return _strided_rows(t[self.n0], self.i0 * pl.bs + pl.lo, self.i1 - self.i0, pl.width, pl.bs)
        return _padded_rows(t[self.n0:self.n1], self.i0 * pl.bs + pl.lo, pl.width)

    def mask_(self, s: torch.Tensor, value: float) -> None:
        """Fill the masked entries of scores ``(n, bs, W)`` in place."""
        if self.edge_mask is not None:
            s.masked_fill_(self.edge_mask, value)
            return
        bs = self.pl.bs
        left, right = _corners(bs, s.device)
        s[:, :, :bs].masked_fill_(left, value)  # keys before the row's first
        s[:, :, -bs:].masked_fill_(right, value)  # keys after the row's last

    def zero_empty_rows_(self, probs: torch.Tensor) -> None:
        if self.edge_mask is not None and self.has_empty:
            probs.masked_fill_(self.empty_rows, 0.0)

    def fill_empty_rows(self, t: torch.Tensor, value: float) -> torch.Tensor:
        return t.masked_fill(self.empty_rows[:, 0], value) if self.edge_mask is not None and self.has_empty else t

    def out_buffer(self, work):
        """Where a bmm writes this slab's rows: in place for a run, else a workspace buffer for :meth:`write_out`."""
        if self.run:
            return self._query_rows(self.out_t)
        return work.take("o", self.n1 - self.n0, self.pl.bs, self.out_t.shape[-1])

    def write_out(self, res: torch.Tensor) -> None:
        if not self.run:
            start = self.i0 * self.pl.bs
            self.out_t[self.n0:self.n1, start:start + self.rows] = res[:, :self.rows]

    def write_lse(self, t: torch.Tensor) -> None:
        lse, start = self.lse_t, self.i0 * self.pl.bs
        assert lse is not None  # called only where the slabs were given an lse to fill
        if self.run:
            lse[self.n0, start:start + t.numel()] = t.reshape(-1)
        else:
            lse[self.n0:self.n1, start:start + self.rows] = t[:, :self.rows]

    def add_window(self, dst: torch.Tensor, part: torch.Tensor) -> None:
        """Add window gradients ``part (n, W, E)`` into the key rows ``dst (N, Lk, E)`` they were read from."""
        pl = self.pl
        first = self.i0 * pl.bs + pl.lo
        if not self.run:
            lo, hi = max(0, first), min(pl.lk, first + pl.width)
            if hi > lo:
                dst[self.n0:self.n1, lo:hi] += part[:, lo - first:hi - first]
            return
        for t in range(0, pl.width, pl.bs):  # windows overlap: add them a block-wide strip at a time
            c = min(pl.bs, pl.width - t)
            _strided_rows(dst[self.n0], first + t, part.shape[0], c, pl.bs).add_(part[:, t:t + c])


_CORNERS: dict = {}


def _corners(bs: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    key = (bs, str(device))
    if key not in _CORNERS:
        r = torch.arange(bs, device=device)
        _CORNERS[key] = (r[None, :] < r[:, None], r[None, :] > r[:, None])  # strictly lower / upper triangle
    return _CORNERS[key]


def _edge_mask(pl: Plan, block: int, device) -> torch.Tensor:
    """Exact ``(bs, W)`` mask (True = masked) of one block."""
    i = block * pl.bs + torch.arange(pl.bs, device=device)[:, None]
    j = block * pl.bs + pl.lo + torch.arange(pl.width, device=device)[None, :]
    return ~((j - i >= pl.lo) & (j - i <= pl.hi) & (j >= 0) & (j < pl.lk) & (i < pl.lq))


def slabs(q, k, v, pl: Plan, out, lse=None, dout=None, delta=None, call_heads: int | None = None):
    """Every slab of every query group; interior runs go per head or per block, whichever makes fewer calls for
    the call's ``call_heads`` (default: ``q``'s): a unit of some of them slabs as the whole call does, so the
    overlapping windows' gradients are added in the same order (the same bits in any units)."""
    n_heads, groups = q.shape[:2]
    step = max(1, SLAB // (pl.bs * pl.width))
    interior = pl.interior_stop - pl.interior_first
    every = n_heads if call_heads is None else call_heads
    per_head = every * -(-interior // step) <= interior * -(-every // step)
    edges = {i: _edge_mask(pl, i, q.device) for i in range(pl.nq) if not pl.interior_first <= i < pl.interior_stop}
    tensors = (q, k, v, out, lse, dout, delta)
    for g in range(groups):
        if per_head:
            for n in range(n_heads):
                for i0 in range(pl.interior_first, pl.interior_stop, step):
                    yield Slab(pl, g, n, n + 1, i0, min(pl.interior_stop, i0 + step), tensors)
        else:
            for i in range(pl.interior_first, pl.interior_stop):
                for n0 in range(0, n_heads, step):
                    yield Slab(pl, g, n0, min(n_heads, n0 + step), i, i + 1, tensors)
        for i, mask in edges.items():
            for n0 in range(0, n_heads, step):
                yield Slab(pl, g, n0, min(n_heads, n0 + step), i, i + 1, tensors, mask)
