"""Path ``fixed-blocks``: the Sparse Transformer's fixed pattern as causal blocks plus summary keys, merged by lse.

``causal() & fixed(b, c)`` (Child et al. 2019, arXiv:1904.10509, Sec. 4.2, Eq. (1) with the
fixed ``A^(1)``, ``A^(2)``) lets query ``i``, in block ``I = i // b``, attend two disjoint
sets of keys whose union is exactly the mask's:

- A: its own block up to itself, ``I b <= j <= i`` (this holds the block's own summary keys);
- S: the ``c`` summary keys of every earlier block, ``J b + b - c <= j < (J + 1) b`` for ``J < I``.

A is causal attention inside each block: one call of torch's fused CPU kernel
(``rules.FLASH``, ``is_causal``) with the blocks as heads, ``(B, H, nb b, D)`` viewed as
``(B, H nb, b, D)``. The length is padded with zeros to ``nb b``: a padded key comes after
every real query of the last block, so causality hides it, and padded rows are dropped.
S is one call per query block ``I >= 1`` against the first ``I c`` summary keys, copied
once into ``(B, H, (nb - 1) c, D)``: every row there has ``I c >= 1`` keys. The two
answers merge by their log-sum-exps (Milakov & Gimelshein 2018, arXiv:1805.02867):
``L = logaddexp(L_A, L_S)``, ``O = e^(L_A - L) O_A + e^(L_S - L) O_S``.

Backward: each call's fused backward (``rules.FLASH_BACKWARD``; FlashAttention-2,
arXiv:2307.08691, Alg. 2) is handed the merged ``(O, L)``: its ``rowsum(dO * O)`` and
``exp(s - L)`` are then the whole softmax's, so it returns exactly its keys' share of dQ
and their dK, dV; dQ adds the two shares, the summary keys' gradients are added back at
their positions. No lse gradient (``rules.lse_without_grad``). Sinks join the merged pair
(``O_s = O sigmoid(L - s)``, ``L_s = logaddexp(L, s)``), from which the same backward runs.

Work per head: ``nb b (b + 1) / 2`` scores in A and ``c b nb (nb - 1) / 2`` in S, against
the gathered block paths' whole key blocks holding a summary (at L = 4096, b = 512,
c = 32: 1.5 M scores a head against 16.8 M for the dense mask). Grouped query heads get
their key/value heads repeated (:func:`.pipeline.upcast_inputs`). Non-finite inputs are
refused (torch's kernel zeroes NaN rows); so are biases, dropout, ``Lq != Lk``,
blocks under ``rules.FIXED_MIN_BLOCK``, a scale ``<= 0`` (torch's causal kernel returns NaN)
and any other mask (a key-padding part included): the gathered block paths take those.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from ..functional import sinks
from ..functional.validate import Problem
from . import rules
from .path_cost import PathCost, fused_attention, itemsize
from .pipeline import KernelOutput, Units, unit_count, upcast_inputs
from .rules import FLASH as _FLASH
from .rules import FLASH_BACKWARD as _FLASH_BACKWARD

__all__ = ["REFUSALS", "run", "op_forward", "op_backward", "cost", "density", "describe", "scores"]

REFUSALS = (rules.full_precision_kv,
            rules.not_compiling, rules.no_weights, rules.causal_fixed, rules.fused_cpu_kernel,
            rules.fused_cpu_backward, rules.softmax_of_dot_products, rules.no_bias, rules.no_dropout,
            rules.equal_head_dims, rules.lse_without_grad, rules.finite_inputs)
FLASH: Any = _FLASH  # never None here: rules.fused_cpu_kernel and rules.fused_cpu_backward refuse builds without
FLASH_BACKWARD: Any = _FLASH_BACKWARD


def _terms(p: Problem) -> tuple[int, int]:
    """``(block, summary)`` of the call's mask (``rules.causal_fixed`` has accepted it)."""
    assert p.mask is not None and p.mask.causal_fixed is not None
    return p.mask.causal_fixed


def _padded(t: torch.Tensor, length: int) -> torch.Tensor:
    """``(B, H, L, E)`` with zero rows after it up to ``length`` (the tensor itself when ``L == length``)."""
    if t.shape[2] == length:
        return t
    out = t.new_zeros(*t.shape[:2], length, t.shape[3])
    out[:, :, :t.shape[2]] = t
    return out


def _as_blocks(t: torch.Tensor, block: int) -> torch.Tensor:
    """``(B, H, nb b, E)`` as ``(B, H nb, b, E)``: the blocks as heads (a view of a contiguous tensor)."""
    batch, heads, length = t.shape[:3]
    return t.view(batch, heads * (length // block), block, *t.shape[3:])


def _summary_view(t: torch.Tensor, block: int, summary: int) -> torch.Tensor:
    """The summary rows of every block but the last, ``(B, H, nb - 1, c, E)``: a view of ``(B, H, nb b, E)``."""
    batch, heads, length, e = t.shape
    return t.view(batch, heads, length // block, block, e)[:, :, :-1, block - summary:]


def _summary(t: torch.Tensor, block: int, summary: int) -> torch.Tensor:
    """The summary keys (or values) ``(B, H, (nb - 1) c, E)``, copied once."""
    s = _summary_view(t, block, summary)
    return s.reshape(*s.shape[:2], -1, s.shape[-1])


def _units(q, block: int, summary: int) -> tuple[Units, list[tuple[int, int]]]:
    """Runs of heads ``[a, b)`` (:class:`.pipeline.Units`): each writes its own rows of the outputs and gradients."""
    batch, heads, length, _ = q.shape
    count = unit_count(heads, batch * heads * scores(block, summary, length))
    return Units(count), [(heads * u // count, heads * (u + 1) // count) for u in range(count)]


def _forward(q, k, v, block: int, summary: int, scale: float):
    """Out ``(B, H, nb b, Dv)`` and lse ``(B, H, nb b)`` of zero-padded contiguous inputs, in units of heads."""
    out, lse = q.new_empty(*q.shape[:3], v.shape[3]), q.new_empty(q.shape[:3])
    units, runs = _units(q, block, summary)

    def share() -> None:  # one thread's runs of heads: a few fused calls each, every operator on one torch thread
        for a, b in (runs[u] for u in units.take()):
            _forward_heads(q[:, a:b], k[:, a:b], v[:, a:b], out[:, a:b], lse[:, a:b], block, summary, scale)
    with units.helping(share):
        share()
    return out, lse


def _forward_heads(q, k, v, out, lse, block: int, summary: int, scale: float) -> None:
    """Fill ``out`` and ``lse`` (views of the call's) for the heads of ``q, k, v``."""
    o_a, l_a = FLASH(_as_blocks(q, block), _as_blocks(k, block), _as_blocks(v, block), 0.0, True, scale=scale)
    _as_blocks(out, block).copy_(o_a)
    _as_blocks(lse[..., None], block)[..., 0].copy_(l_a)
    ks, vs = _summary(k, block, summary), _summary(v, block, summary)
    for i in range(1, q.shape[2] // block):
        rows, keys = slice(i * block, (i + 1) * block), i * summary
        o_s, l_s = FLASH(q[:, :, rows], ks[:, :, :keys], vs[:, :, :keys], 0.0, False, scale=scale)
        _merge_(out[:, :, rows], lse[:, :, rows], o_s, l_s)


def _merge_(o, lse, o_s, l_s) -> None:
    """``(o, lse)`` in place with a second part over disjoint keys (both lse finite; no ``torch.logaddexp``,
    which took 7x as long on these rows)."""
    m = torch.maximum(lse, l_s)
    w, w_s = torch.exp(lse - m), torch.exp(l_s - m)
    total = w + w_s
    o.mul_((w / total)[..., None]).add_(o_s.mul_((w_s / total)[..., None]))
    lse.copy_(m.add_(total.log_()))


def _backward(q, k, v, out, lse, dout, block: int, summary: int, scale: float):
    """``dq, dk, dv`` of zero-padded inputs from the merged ``(out, lse)``, in units of heads."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    units, runs = _units(q, block, summary)

    def share() -> None:  # one thread's runs of heads: their key and value rows are their own
        for a, b in (runs[u] for u in units.take()):
            heads = [t[:, a:b] for t in (q, k, v, out, lse, dout, dq, dk, dv)]
            _backward_heads(heads, block, summary, scale)
    with units.helping(share):
        share()
    return dq, dk, dv


def _backward_heads(tensors, block: int, summary: int, scale: float) -> None:
    """Fill ``dq, dk, dv`` (views of the call's) for the heads of ``q, k, v``: each fused call's share of the
    whole softmax, from the merged ``(out, lse)``; ``tensors`` = ``q, k, v, out, lse, dout, dq, dk, dv``."""
    q, k, v, out, lse, dout, dq, dk, dv = tensors
    def blocks(t):
        return _as_blocks(t, block)

    grads = FLASH_BACKWARD(blocks(dout), blocks(q), blocks(k), blocks(v), blocks(out),
                           _as_blocks(lse[..., None], block)[..., 0], 0.0, True, scale=scale)
    for dst, g in zip((dq, dk, dv), grads, strict=True):
        blocks(dst).copy_(g)
    n = q.shape[2] // block
    if n > 1:
        ks, vs = _summary(k, block, summary), _summary(v, block, summary)
        dks, dvs = torch.zeros_like(ks), torch.zeros_like(vs)
        for i in range(1, n):
            rows, keys = slice(i * block, (i + 1) * block), i * summary
            g_q, g_k, g_v = FLASH_BACKWARD(dout[:, :, rows], q[:, :, rows], ks[:, :, :keys], vs[:, :, :keys],
                                           out[:, :, rows], lse[:, :, rows], 0.0, False, scale=scale)
            dq[:, :, rows] += g_q
            dks[:, :, :keys] += g_k
            dvs[:, :, :keys] += g_v
        _summary_view(dk, block, summary).add_(dks.view(_summary_view(dk, block, summary).shape))
        _summary_view(dv, block, summary).add_(dvs.view(_summary_view(dv, block, summary).shape))


class _FixedBlocks(torch.autograd.Function):
    """With sinks, the merged ``(out, lse)`` are joined with them and the fused backward runs from the joined
    pair, which rebuilds the sink call's probabilities (:mod:`attnkit.functional.sinks`)."""

    @staticmethod
    def forward(ctx, q, k, v, sink_logits, block: int, summary: int, scale: float):
        length = q.shape[2]
        padded = -(-length // block) * block
        q, k, v = (_padded(t, padded) for t in (q, k, v))
        out, lse = _forward(q, k, v, block, summary, scale)
        if sink_logits is not None:  # per-token sinks: -inf (plain softmax) on the padded rows
            if sinks.per_token(sink_logits):
                sink_logits = torch.nn.functional.pad(sink_logits, (0, padded - length), value=float("-inf"))
            out, lse = sinks.joined(out, lse, sink_logits)
        ctx.save_for_backward(q, k, v, out, lse, sink_logits)
        ctx.block, ctx.summary, ctx.scale, ctx.length = block, summary, scale, length
        return out[:, :, :length], lse[:, :, :length]

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, _dlse):  # the rules refuse an lse under autograd: _dlse is never used
        q, k, v, out, lse, sink_logits = ctx.saved_tensors
        dout = _padded(dout, q.shape[2]).contiguous()
        dsinks = None
        if ctx.needs_input_grad[3]:
            dsinks = sinks.kernel_gradient(dout, out, lse, sink_logits)
            dsinks = dsinks[..., :ctx.length] if sinks.per_token(sink_logits) else dsinks
        grads = _backward(q, k, v, out, lse, dout, ctx.block, ctx.summary, ctx.scale)
        return (*(g[:, :, :ctx.length] for g in grads), dsinks, None, None, None)


def backward_differentiable(p: Problem) -> bool:
    """Its backward is torch's fused kernel: a second derivative recomputes the call (pipeline.twice_differentiable)."""
    return False


def run(p: Problem) -> KernelOutput:
    """Out ``(B, H, Lq, Dv)`` and lse ``(B, H, Lq)`` or None, in the compute dtype."""
    q, k, v = upcast_inputs(p)
    block, summary = _terms(p)
    out, lse = _FixedBlocks.apply(q, k, v, p.sinks, block, summary, p.scale)
    return KernelOutput(out, None, lse if p.return_lse else None)


def _padded_inputs(p: Problem):
    """q, k, v (:func:`.pipeline.upcast_inputs`) zero-padded to whole blocks, the block, summary and length."""
    block, summary = _terms(p)
    length = p.sizes[2]
    padded = -(-length // block) * block
    return tuple(_padded(t, padded) for t in upcast_inputs(p)), block, summary, length


def op_forward(p: Problem):
    """For the compiled operator: out ``(B, H, Lq, Dv)`` and the merged lse ``(B, H, Lq)``, without autograd."""
    (q, k, v), block, summary, length = _padded_inputs(p)
    out, lse = _forward(q, k, v, block, summary, p.scale)
    return out[:, :, :length], lse[:, :, :length]


def op_backward(p: Problem, out, lse, dout):
    """For the compiled operator: ``dq, dk, dv`` (key/value heads repeated for grouped queries) from
    :func:`op_forward`'s output and lse."""
    (q, k, v), block, summary, length = _padded_inputs(p)
    out, lse, dout = (_padded(t, q.shape[2]).contiguous() for t in (out, lse[..., None], dout.to(out.dtype)))
    grads = _backward(q, k, v, out, lse[..., 0], dout, block, summary, p.scale)
    return tuple(g[:, :, :length] for g in grads)


def scores(block: int, summary: int, length: int) -> int:
    """Scores torch's fused kernel computes for one head over the padded length: ``nb b^2`` in the blocks (its causal
    flag skips whole tiles only, so a block costs a square, as torch's FLOP formula counts it) and
    ``c b nb (nb - 1) / 2`` against earlier summaries."""
    nb = -(-length // block)
    return nb * block * block + summary * block * nb * (nb - 1) // 2


def density(p: Problem) -> float:
    """The fraction of the ``Lq x Lk`` scores computed (the dispatcher compares it with ``sparse_below``)."""
    _, _, lq, lk, _, _ = p.sizes
    return scores(*_terms(p), lq) / (lq * lk)


def describe(p: Problem) -> str:
    block, summary = _terms(p)
    return (f"causal attention in each block of {block} (one fused call, the blocks as heads) and the {summary} "
            f"summary keys of every earlier block (one fused call per block), merged by lse")


def cost(p: Problem, grad: bool = False) -> PathCost:
    """The two kinds of scores in torch's fused kernel; extra memory: the summary keys and values, and the
    zero-padded inputs when ``L`` is not a multiple of the block."""
    batch, heads, lq, _, d, dv = p.sizes
    block, summary = _terms(p)
    pairs = batch * heads * scores(block, summary, lq)
    nb = -(-lq // block)
    copies = batch * heads * ((nb - 1) * summary * (d + dv) + (nb * block - lq) * (2 * d + 2 * dv))
    return PathCost(pairs, float(copies * itemsize(p)),
                    fused=fused_attention("attention (causal blocks + summary keys)", pairs, d, dv),
                    materialized=False)
