"""Path ``fixed-blocks``: the Sparse Transformer's fixed pattern as blocks plus summary keys, merged by lse.

``fixed(b, c)`` (Child et al. 2019, arXiv:1904.10509, Sec. 4.2, Eq. (1) with the fixed ``A^(1)``,
``A^(2)``) lets query ``i``, in block ``I = i // b``, attend its own block and the last ``c``
positions of every block (the summary keys, ``j mod b >= b - c``). Both forms split the keys into
two disjoint sets whose union is exactly the mask's.

With ``causal()``:

- A: its own block up to itself, ``I b <= j <= i`` (this holds the block's own summary keys);
- S: the ``c`` summary keys of every earlier block, ``J b + b - c <= j < (J + 1) b`` for ``J < I``.

A is causal attention inside each block: one call of torch's fused CPU kernel
(``rules.FLASH``, ``is_causal``) with the blocks as heads, ``(B, H, nb b, D)`` viewed as
``(B, H nb, b, D)``. The length is padded with zeros to ``nb b``: a padded key comes after
every real query of the last block, so causality hides it, and padded rows are dropped.
S is one call per query block ``I >= 1`` against the first ``I c`` summary keys, copied
once into ``(B, H, (nb - 1) c, D)``: every row there has ``I c >= 1`` keys.

Without it (no padding: the kernel cannot hide a padded key), with ``a = b - c``:

- A: the ``a`` plain keys of its own block, ``I b <= j < I b + a`` (``j < L``);
- S: every summary key of the sequence, its own block's included (so those are counted once).

A is one call with the ``nb' = L // b`` whole blocks as heads (queries ``(B, H nb', b, D)``
against their plain keys ``(B, H nb', a, D)``) and one for a partial last block; S is one call of
every query against the ``ns = nb' c + max(0, r - a)`` summary keys (``r = L - nb' b``), gathered
once. Either set is empty only when the other holds every key of the row (``c = b``: all keys are
summaries; ``L <= a``: one block without one).

The two answers merge by their log-sum-exps (Milakov & Gimelshein 2018, arXiv:1805.02867):
``L = logaddexp(L_A, L_S)``, ``O = e^(L_A - L) O_A + e^(L_S - L) O_S``.

Backward: each call's fused backward (``rules.FLASH_BACKWARD``; FlashAttention-2,
arXiv:2307.08691, Alg. 2) is handed the merged ``(O, L)``: its ``rowsum(dO * O)`` and
``exp(s - L)`` are then the whole softmax's, so it returns exactly its keys' share of dQ
and their dK, dV; dQ adds the two shares, the summary keys' gradients are added back at
their positions. No lse gradient (``rules.lse_without_grad``). Sinks join the merged pair
(``O_s = O sigmoid(L - s)``, ``L_s = logaddexp(L, s)``), from which the same backward runs.

Work per head, causal: ``nb b (b + 1) / 2`` scores in A and ``c b nb (nb - 1) / 2`` in S, against
the gathered block paths' whole key blocks holding a summary (at L = 4096, b = 512,
c = 32: 1.5 M scores a head against 16.8 M for the dense mask); not causal: ``L a + L ns`` about
(at L = 2048, b = 64, c = 1: 0.19 M against 4.2 M, where every key block holds a summary key, so
the block paths' layout is dense). Grouped query heads get
their key/value heads repeated (:func:`.pipeline.upcast_inputs`). Non-finite inputs are
refused (torch's kernel zeroes NaN rows); so are biases, dropout, ``Lq != Lk``,
blocks under ``rules.FIXED_MIN_BLOCK``, with ``causal()`` a scale ``<= 0`` (torch's causal kernel
returns NaN) and any other mask (a key-padding part included): the gathered block paths take those.
"""

from __future__ import annotations

from typing import Any, NamedTuple

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
            rules.not_compiling, rules.no_weights, rules.fixed_pattern, rules.fused_cpu_kernel,
            rules.fused_cpu_backward, rules.softmax_of_dot_products, rules.no_bias, rules.no_dropout,
            rules.equal_head_dims, rules.lse_without_grad, rules.finite_inputs)
FLASH: Any = _FLASH  # never None here: rules.fused_cpu_kernel and rules.fused_cpu_backward refuse builds without
FLASH_BACKWARD: Any = _FLASH_BACKWARD


def _terms(p: Problem) -> tuple[int, int, bool]:
    """``(block, summary, causal)`` of the call's mask (``rules.fixed_pattern`` has accepted it)."""
    terms = rules.fixed_terms(p)
    assert terms is not None
    return terms


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


class _Split(NamedTuple):
    """The keys of ``fixed(b, c)`` without ``causal()`` over ``L = nf b + r`` positions, ``a = b - c``: the ``nf``
    whole blocks' first ``a`` positions (their plain keys), the partial block's first ``min(r, a)`` positions, and
    every summary key (``summaries``, ``(ns,)`` positions). The three are a partition of ``[0, L)``."""

    block: int
    plain: int  # a
    whole: int  # nf
    tail_plain: int  # min(r, a)
    summaries: torch.Tensor


def _split(length: int, block: int, summary: int, device) -> _Split:
    """:class:`_Split` of ``length`` positions."""
    plain, j = block - summary, torch.arange(length, device=device)
    whole = length // block
    return _Split(block, plain, whole, min(length - whole * block, plain), j[j % block >= plain])


def _units(q, block: int, summary: int, causal: bool = True) -> tuple[Units, list[tuple[int, int]]]:
    """Runs of heads ``[a, b)`` (:class:`.pipeline.Units`): each writes its own rows of the outputs and gradients."""
    batch, heads, length, _ = q.shape
    count = unit_count(heads, batch * heads * scores(block, summary, length, causal))
    return Units(count), [(heads * u // count, heads * (u + 1) // count) for u in range(count)]


def _forward(q, k, v, block: int, summary: int, scale: float, split: _Split | None = None):
    """Out ``(B, H, nb b, Dv)`` and lse ``(B, H, nb b)`` of zero-padded contiguous inputs (causal), or of the
    inputs as they are with their ``split`` (not causal), in units of heads."""
    out, lse = q.new_empty(*q.shape[:3], v.shape[3]), q.new_empty(q.shape[:3])
    units, runs = _units(q, block, summary, split is None)

    def share() -> None:  # one thread's runs of heads: a few fused calls each, every operator on one torch thread
        for a, b in (runs[u] for u in units.take()):
            heads = (q[:, a:b], k[:, a:b], v[:, a:b], out[:, a:b], lse[:, a:b])
            if split is None:
                _forward_heads(*heads, block, summary, scale)
            else:
                _forward_split(*heads, split, scale)
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


def _in_blocks(t: torch.Tensor, sp: _Split, width: int) -> torch.Tensor:
    """The first ``width`` rows of every whole block of ``(B, H, L, E)``: a view ``(B, H, nf, width, E)``."""
    return t[:, :, :sp.whole * sp.block].unflatten(2, (sp.whole, sp.block))[:, :, :, :width]


def _as_heads(t: torch.Tensor) -> torch.Tensor:
    """``(B, H, nf, w, E)`` as ``(B, H nf, w, E)`` (a view where the strides allow, else a copy)."""
    return t.flatten(1, 2)


def _whole_blocks(t: torch.Tensor, sp: _Split) -> torch.Tensor:
    """The rows of the whole blocks of ``(B, H, L, E)`` as ``(B, H nf, b, E)`` (a view when ``L = nf b``)."""
    return _as_heads(_in_blocks(t, sp, sp.block))


def _plain_keys(t: torch.Tensor, sp: _Split) -> torch.Tensor:
    """The whole blocks' plain keys (or values) of ``(B, H, L, E)`` as ``(B, H nf, a, E)``."""
    return _as_heads(_in_blocks(t, sp, sp.plain))


def _forward_split(q, k, v, out, lse, sp: _Split, scale: float) -> None:
    """Not causal: fill ``out`` and ``lse`` (views of the call's) for the heads of ``q, k, v``: each block's rows
    against its plain keys (whole blocks as heads in one call, a partial last block in one), every row against
    every summary key (one call), merged by lse."""
    heads, rows = q.shape[1], sp.whole * sp.block
    if sp.plain and sp.whole:
        o_a, l_a = FLASH(_whole_blocks(q, sp), _plain_keys(k, sp), _plain_keys(v, sp), 0.0, False, scale=scale)
        _in_blocks(out, sp, sp.block).copy_(o_a.unflatten(1, (heads, sp.whole)))
        _in_blocks(lse[..., None], sp, sp.block)[..., 0].copy_(l_a.unflatten(1, (heads, sp.whole)))
    if sp.tail_plain:
        keys = slice(rows, rows + sp.tail_plain)
        o_a, l_a = FLASH(q[:, :, rows:], k[:, :, keys], v[:, :, keys], 0.0, False, scale=scale)
        out[:, :, rows:].copy_(o_a)
        lse[:, :, rows:].copy_(l_a)
    if len(sp.summaries):
        ks, vs = k.index_select(2, sp.summaries), v.index_select(2, sp.summaries)
        o_s, l_s = FLASH(q, ks, vs, 0.0, False, scale=scale)
        if sp.plain:
            _merge_(out, lse, o_s, l_s)
        else:  # every key a summary key: S is the whole softmax
            out.copy_(o_s)
            lse.copy_(l_s)


def _merge_(o, lse, o_s, l_s) -> None:
    """``(o, lse)`` in place with a second part over disjoint keys (both lse finite; no ``torch.logaddexp``,
    which took 7x as long on these rows)."""
    m = torch.maximum(lse, l_s)
    w, w_s = torch.exp(lse - m), torch.exp(l_s - m)
    total = w + w_s
    o.mul_((w / total)[..., None]).add_(o_s.mul_((w_s / total)[..., None]))
    lse.copy_(m.add_(total.log_()))


def _backward(q, k, v, out, lse, dout, block: int, summary: int, scale: float, split: _Split | None = None):
    """``dq, dk, dv`` of zero-padded inputs (causal) or of the inputs with their ``split`` (not causal) from the
    merged ``(out, lse)``, in units of heads."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    units, runs = _units(q, block, summary, split is None)

    def share() -> None:  # one thread's runs of heads: their key and value rows are their own
        for a, b in (runs[u] for u in units.take()):
            heads = [t[:, a:b] for t in (q, k, v, out, lse, dout, dq, dk, dv)]
            if split is None:
                _backward_heads(heads, block, summary, scale)
            else:
                _backward_split(heads, split, scale)
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


def _backward_split(tensors, sp: _Split, scale: float) -> None:
    """Not causal: fill ``dq, dk, dv`` (views of the call's) for the heads of ``q, k, v`` from the merged
    ``(out, lse)``, each call's share (:func:`_forward_split`'s calls); every key position is written once (the
    three key sets are a partition); ``tensors`` = ``q, k, v, out, lse, dout, dq, dk, dv``."""
    q, k, v, out, lse, dout, dq, dk, dv = tensors
    heads, rows = q.shape[1], sp.whole * sp.block
    if sp.plain and sp.whole:
        def blocks(t):
            return _whole_blocks(t, sp)
        g_q, g_k, g_v = FLASH_BACKWARD(blocks(dout), blocks(q), _plain_keys(k, sp), _plain_keys(v, sp), blocks(out),
                                       blocks(lse[..., None])[..., 0], 0.0, False, scale=scale)
        for dst, g, width in ((dq, g_q, sp.block), (dk, g_k, sp.plain), (dv, g_v, sp.plain)):
            _in_blocks(dst, sp, width).copy_(g.unflatten(1, (heads, sp.whole)))
    if sp.tail_plain:
        keys = slice(rows, rows + sp.tail_plain)
        parts = (dout[:, :, rows:], q[:, :, rows:], k[:, :, keys], v[:, :, keys], out[:, :, rows:], lse[:, :, rows:])
        g_q, g_k, g_v = FLASH_BACKWARD(*(t.contiguous() for t in parts), 0.0, False, scale=scale)
        dq[:, :, rows:].copy_(g_q)
        dk[:, :, keys].copy_(g_k)
        dv[:, :, keys].copy_(g_v)
    if len(sp.summaries):
        ks, vs = k.index_select(2, sp.summaries), v.index_select(2, sp.summaries)
        g_q, g_k, g_v = FLASH_BACKWARD(dout, q, ks, vs, out, lse, 0.0, False, scale=scale)
        if sp.plain:
            dq.add_(g_q)
        else:
            dq.copy_(g_q)
        dk.index_copy_(2, sp.summaries, g_k)
        dv.index_copy_(2, sp.summaries, g_v)


class _FixedBlocks(torch.autograd.Function):
    """With sinks, the merged ``(out, lse)`` are joined with them and the fused backward runs from the joined
    pair, which rebuilds the sink call's probabilities (:mod:`attnkit.functional.sinks`)."""

    @staticmethod
    def forward(ctx, q, k, v, sink_logits, block: int, summary: int, causal: bool, scale: float):
        length = q.shape[2]
        padded = -(-length // block) * block if causal else length
        split = None if causal else _split(length, block, summary, q.device)
        q, k, v = (_padded(t, padded) for t in (q, k, v))
        out, lse = _forward(q, k, v, block, summary, scale, split)
        if sink_logits is not None:  # per-token sinks: -inf (plain softmax) on the padded rows
            if sinks.per_token(sink_logits):
                sink_logits = torch.nn.functional.pad(sink_logits, (0, padded - length), value=float("-inf"))
            out, lse = sinks.joined(out, lse, sink_logits)
        ctx.save_for_backward(q, k, v, out, lse, sink_logits)
        ctx.block, ctx.summary, ctx.scale, ctx.length, ctx.split = block, summary, scale, length, split
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
        grads = _backward(q, k, v, out, lse, dout, ctx.block, ctx.summary, ctx.scale, ctx.split)
        return (*(g[:, :, :ctx.length] for g in grads), dsinks, None, None, None, None)


def backward_differentiable(p: Problem) -> bool:
    """Its backward is torch's fused kernel: a second derivative recomputes the call (pipeline.twice_differentiable)."""
    return False


def run(p: Problem) -> KernelOutput:
    """Out ``(B, H, Lq, Dv)`` and lse ``(B, H, Lq)`` or None, in the compute dtype."""
    q, k, v = upcast_inputs(p)
    block, summary, causal = _terms(p)
    out, lse = _FixedBlocks.apply(q, k, v, p.sinks, block, summary, causal, p.scale)
    return KernelOutput(out, None, lse if p.return_lse else None)


def _padded_inputs(p: Problem):
    """q, k, v (:func:`.pipeline.upcast_inputs`) zero-padded to whole blocks (causal; as they are otherwise), the
    block, summary, length and the :class:`_Split` (None when causal)."""
    block, summary, causal = _terms(p)
    length = p.sizes[2]
    padded = -(-length // block) * block if causal else length
    split = None if causal else _split(length, block, summary, p.q.device)
    return tuple(_padded(t, padded) for t in upcast_inputs(p)), block, summary, length, split


def op_forward(p: Problem):
    """For the compiled operator: out ``(B, H, Lq, Dv)`` and the merged lse ``(B, H, Lq)``, without autograd."""
    (q, k, v), block, summary, length, split = _padded_inputs(p)
    out, lse = _forward(q, k, v, block, summary, p.scale, split)
    return out[:, :, :length], lse[:, :, :length]


def op_backward(p: Problem, out, lse, dout):
    """For the compiled operator: ``dq, dk, dv`` (key/value heads repeated for grouped queries) from
    :func:`op_forward`'s output and lse."""
    (q, k, v), block, summary, length, split = _padded_inputs(p)
    out, lse, dout = (_padded(t, q.shape[2]).contiguous() for t in (out, lse[..., None], dout.to(out.dtype)))
    grads = _backward(q, k, v, out, lse[..., 0], dout, block, summary, p.scale, split)
    return tuple(g[:, :, :length] for g in grads)


def scores(block: int, summary: int, length: int, causal: bool = True) -> int:
    """Scores torch's fused kernel computes for one head. Causal, over the padded length: ``nb b^2`` in the blocks
    (its causal flag skips whole tiles only, so a block costs a square, as torch's FLOP formula counts it) and
    ``c b nb (nb - 1) / 2`` against earlier summaries. Not causal: ``nf b a + r min(r, a)`` against the plain
    keys and ``L ns`` against the summary keys (:class:`_Split`)."""
    if not causal:
        plain, (whole, tail) = block - summary, divmod(length, block)
        summaries = whole * summary + max(0, tail - plain)
        return whole * block * plain + tail * min(tail, plain) + length * summaries
    nb = -(-length // block)
    return nb * block * block + summary * block * nb * (nb - 1) // 2


def density(p: Problem) -> float:
    """The fraction of the ``Lq x Lk`` scores computed (the dispatcher compares it with ``sparse_below``)."""
    _, _, lq, lk, _, _ = p.sizes
    block, summary, causal = _terms(p)
    return scores(block, summary, lq, causal) / (lq * lk)


def describe(p: Problem) -> str:
    block, summary, causal = _terms(p)
    if not causal:
        return (f"each block of {block} against its {block - summary} plain keys (one fused call, the blocks as "
                f"heads) and every query against the {summary} summary keys of every block (one fused call), "
                f"merged by lse")
    return (f"causal attention in each block of {block} (one fused call, the blocks as heads) and the {summary} "
            f"summary keys of every earlier block (one fused call per block), merged by lse")


def cost(p: Problem, grad: bool = False) -> PathCost:
    """The two kinds of scores in torch's fused kernel; extra memory: the summary keys and values, and (causal)
    the zero-padded inputs when ``L`` is not a multiple of the block, or (not causal) the whole blocks' queries
    and plain keys and values, copied when ``L`` is not a multiple of the block (else views)."""
    batch, heads, lq, _, d, dv = p.sizes
    block, summary, causal = _terms(p)
    pairs = batch * heads * scores(block, summary, lq, causal)
    nb = -(-lq // block)
    if causal:
        copies = batch * heads * ((nb - 1) * summary * (d + dv) + (nb * block - lq) * (2 * d + 2 * dv))
    else:
        (whole, tail), plain = divmod(lq, block), block - summary
        summaries = whole * summary + max(0, tail - plain)
        copies = batch * heads * (summaries * (d + dv) + (tail > 0) * whole * (block * d + plain * (d + dv)))
    label = "causal blocks" if causal else "blocks"
    return PathCost(pairs, float(copies * itemsize(p)),
                    fused=fused_attention(f"attention ({label} + summary keys)", pairs, d, dv),
                    materialized=False)
