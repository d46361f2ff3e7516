"""Soft-capped attention without a running maximum: ``softmax(cap * tanh(scale * q k^T / cap)) v``.

Soft-capping (Gemma 2, arXiv:2408.00118) bounds every score to ``[-cap, cap]``,
so the softmax needs no row maximum: with one fixed shift ``c`` per problem,
``exp(cap * tanh(.) - c)`` neither overflows (summed over ``Lk`` keys) nor
underflows (the largest entry of a row stays a normal float) when
``2 cap + log(Lk)`` fits the dtype's exponent range (``cap`` up to about 80 in
float32). Softmax is shift-invariant, so the result is exact; the online-softmax
rescaling of :mod:`.chunked` disappears and each key block costs one matmul,
``tanh``, a multiply, ``exp`` (in place) and a matmul with V::

    e = exp(cap * tanh(q' k^T) - c)   with q' = q * scale / cap
    out = (sum_blocks e V) / (sum_blocks rowsum(e));   lse = log(sum rowsum(e)) + c

Under autograd a custom backward (Dao 2023, arXiv:2307.08691, Alg. 2, with the
chain rule through ``cap * tanh``: ``dT = dS * (1 - tanh^2) * scale``) recomputes
each block from the saved ``lse``; nothing of size ``Lq x Lk`` is kept.
Blocks are small enough to stay in cache (``BLOCK`` score elements).
"""

from __future__ import annotations

import math

import torch

from ..bias import Softcap
from ..functional.normalize import guard_empty_rows
from ..functional.validate import Problem
from .common import dense_indices, upcast_inputs
from .softcap_grad import SoftcapAttention

__all__ = ["refusal", "run", "shift", "describe", "Blocks"]

# (query rows, score elements) per block; keys per block follow. Measured on 1 core at L = 2048:
# larger matmuls beat cache-sized blocks in the forward (the backward's sizes are in softcap_grad).
FORWARD_BLOCKS = (256, 1 << 21)

_NEG_INF = float("-inf")


def shift(cap: float, kv_len: int, dtype) -> float | None:
    """The fixed shift ``c`` for ``exp(cap * tanh - c)``, or None when the dtype's range is too small."""
    info = torch.finfo(dtype)
    hi, lo = math.log(info.max) - 1.0, math.log(info.tiny) + 1.0
    c = max(0.0, cap + math.log(max(1, kv_len)) - hi)
    return c if -cap - c >= lo else None


def refusal(p: Problem) -> str | None:
    if type(p.modifier) is not Softcap or p.bias is not None:
        return "a Softcap modifier alone"
    if p.normalize != "softmax" or p.score not in ("dot", "scaled_dot") or p.dropout_p > 0 or p.return_weights:
        return "softmax of dot products, no dropout, no weights"
    if torch.compiler.is_compiling():
        return "under torch.compile the general loop is traced"
    if shift(p.modifier.cap, p.sizes[3], p.compute_dtype) is None:
        return f"cap={p.modifier.cap} too large for a fixed shift in {p.compute_dtype}"
    return None


class Blocks:
    """Row and key blocks of a problem, and the mask of each block."""

    def __init__(self, p: Problem, sizes=FORWARD_BLOCKS):
        batch, heads, lq, lk, _, _ = p.sizes
        self.p, self.cap = p, p.modifier.cap
        self.c = shift(self.cap, lk, p.compute_dtype)
        self.rows = max(1, min(lq, sizes[0]))
        self.cols = max(1, min(lk, sizes[1] // max(1, batch * heads * self.rows)))

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

    def weights(self, qs, kt, rs, re, ks, ke, lse=None):
        """``exp(cap * tanh(qs kt) - c - lse)`` of a block, 0 where masked.

        Without ``lse`` (forward) everything runs in place and ``tanh`` is not
        kept; with the rows' ``lse`` (backward) it returns ``(p, tanh)``.
        """
        t = torch.tanh_(qs @ kt[..., ks:ke])  # (B, H, rows, keys)
        e = t.mul_(self.cap) if lse is None else t * self.cap
        e = e.sub_(self.c if lse is None else lse.unsqueeze(-1) + self.c).exp_()
        allowed = self.allowed(rs, re, ks, ke, qs.device)
        e = e if allowed is None else e.masked_fill_(~allowed, 0.0)
        return e if lse is None else (e, t)

    def forward(self, q, k, v):
        """``(out, lse)`` in the compute dtype."""
        p = self.p
        kt = k.transpose(-1, -2)
        qs = q * (p.scale / self.cap)
        outs, lses = [], []
        for rs, re in self.row_slabs():
            acc = l = None
            for ks, ke in self.key_blocks():
                e = self.weights(qs[:, :, rs:re], kt, rs, re, ks, ke)
                part, total = e @ v[:, :, ks:ke], e.sum(-1, keepdim=True)
                acc, l = (part, total) if acc is None else (acc.add_(part), l.add_(total))
            l_safe, lse = guard_empty_rows(torch.full_like(l, self.c), l)
            outs.append(acc.div_(l_safe))
            lses.append(lse)
        return torch.cat(outs, 2), torch.cat(lses, 2)


def describe(p: Problem) -> str:
    c = shift(p.modifier.cap, p.sizes[3], p.compute_dtype)
    return f"soft-capping with a fixed shift {c:g} instead of a running max (kernels/softcap_loop.py)"


def run(p: Problem):
    """``(out, lse)``; under autograd through :class:`~.softcap_grad.SoftcapAttention`."""
    q, k, v = upcast_inputs(p)
    blocks = Blocks(p)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return SoftcapAttention.apply(blocks, q, k, v)
    return blocks.forward(q, k, v)
