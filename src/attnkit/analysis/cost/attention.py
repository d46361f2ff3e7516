"""The cost of one :func:`attnkit.attention` call, following the kernel the dispatcher picks.

:func:`attend` asks :func:`attnkit.explain` which kernel ``backend="auto"`` (or a
forced backend) runs, on stand-in tensors of the right shapes (one element each,
expanded), and counts that kernel's products:

- ``sdpa``: torch's SDPA formula ``2 B H Lq Lk (D + Dv)``; the backward is the fused
  CPU kernel's formula (it recomputes the scores) when torch picks it
  (``D == Dv`` and no dropout), else twice the forward (the math path's products);
- ``reference`` / ``chunked``: ``Q K^T`` and ``weights @ V`` over all ``Lq x Lk`` pairs
  (chunking moves no FLOPs); under autograd a chunked slab that is checkpointed runs
  its forward again in the backward. The chunked kernel's special paths (an additive
  bias on torch's fused kernel in row slabs, the soft-cap loop) have hand-written
  backwards that recompute the scores: ``2 B H Lq Lk (3 D + 2 Dv)``;
- ``blocksparse``: only the gathered key blocks, slab by slab, exactly as the kernel
  plans them (``kernels.blocksparse.plan``: block size, widths, padding lanes included);
  plain softmax has a hand-written backward (scores recomputed); other scores and
  normalisers go through autograd, and a checkpointed slab re-runs its score product
  in the backward; a band mask (``lo <= j - i <= hi``) goes to the band path instead;
- ``window_band``: every window block of the band kernel's plan, with its hand-written
  backward (scores recomputed).

Elementwise work (scaling, masking, softmax at ~5 operations per score) goes to
``other_flops``; the kernel's workspace is the dispatcher's own memory estimate.
"""

from __future__ import annotations

import torch

from ...attention import explain
from ...functional.validate import validate
from ...kernels import blocksparse, chunked
from .tally import Tally, zeros

__all__ = ["attend"]

_SOFTMAX_OPS = 5  # max, subtract, exp, sum, divide per score entry


def attend(t: Tally, label: str, b: int, h: int, lq: int, lk: int, d: int, dv: int, *, hkv: int | None = None,
           grads: tuple[bool, bool, bool] = (True, True, True), weights_grad: bool = False,
           pairwise: bool = True, dtype: torch.dtype = torch.float32, **kwargs) -> str:
    """Record one ``attention(q, k, v, **kwargs)`` with q ``(b, h, lq, d)``, k/v ``(b, hkv, lk, d|dv)``.

    Args:
        label: prefix of the term names ("" for a lone call).
        grads: which of q, k, v need a gradient (for the backward count).
        weights_grad: the weights need a gradient besides through q and k (a bias that needs one).
        pairwise: the score is ``q k^T`` ("dot", "scaled_dot", "cosine"); False for a score function
            whose own products the caller counts.
        kwargs: the attention() keyword arguments (mask, bias, score, normalize, ...); a bias tensor
            may be a stand-in of the right shape.

    Returns:
        The backend that runs.
    """
    hkv = h if hkv is None else hkv
    gq, gk, gv = grads
    grad = t.backward and (gq or gk or gv)  # kernels plan differently under autograd: decide as the run does
    with torch.enable_grad() if grad else torch.no_grad():
        q, k, v = (zeros(dtype, *shape, requires_grad=grad) for shape in
                   ((b, h, lq, d), (b, hkv, lk, d), (b, hkv, lk, dv)))
        decision = explain(q, k, v, **kwargs)
        backend = decision.backend
        t.io(q.numel() + k.numel() + v.numel() + b * h * lq * dv)
        if 0 in (b, h, lq, lk):
            return backend
        grads = (gq or gk or gv, int(gq) + int(gk), int(gq or gk or weights_grad) + int(gv))
        computed = _kernel(t, label, backend, validate(q, k, v, **kwargs), grads, pairwise)
    t.transient(decision.peak_bytes)
    t.ew(f"{label}softmax and mask", computed, _SOFTMAX_OPS + (kwargs.get("mask") is not None))
    t.ew(f"{label}scale", b * h * lq * d)
    t.inter(b * h * lq * dv)
    return backend


def _kernel(t: Tally, label: str, backend: str, p, grads, pairwise: bool) -> int:
    """Record the products of ``backend`` on problem ``p``; returns the number of score entries computed.

    ``grads``: (any gradient, operands of the score product needing one, of the output product).
    """
    grad, s_grads, o_grads = grads
    b, h, lq, lk, d, dv = p.sizes
    computed = b * h * lq * lk
    if backend == "sdpa":
        flash = d == dv and not p.dropout_p  # torch's CPU choice between its fused kernel and the math path
        t.sdpa(f"{label}attention (SDPA)", b, h, lq, lk, d, dv, flash=flash, grad=grad)
        if not flash:
            t.inter(computed, computed, keep=False)  # the math path's scores and weights
    elif backend == "window_band" or (backend == "blocksparse" and _band(p)):
        computed = _window_band(t, label, p, d, dv, grad)
    elif backend == "blocksparse":
        computed = _blocksparse(t, label, p, grad, s_grads, o_grads, pairwise)
        t.inter(computed, computed, keep=False)
    elif backend == "chunked" and _path(chunked, p, _CHUNKED_PATHS):
        t.fused(f"{label}attention ({_path(chunked, p, _CHUNKED_PATHS)})", 2 * computed * (d + dv),
                2 * computed * (3 * d + 2 * dv), grad=grad)
    else:
        recompute = backend == "chunked" and grad and chunked.plan(p, True)[0] < lq
        if pairwise:
            t.mm(f"{label}scores (q k^T)", b * h, lq, d, lk, grads=s_grads, recompute=recompute)
        t.mm(f"{label}weights @ v", b * h, lq, lk, dv, grads=o_grads, recompute=recompute)
        t.inter(computed, computed, keep=False)
    return computed


# Paths of the chunked kernel with a backward written by hand (FlashAttention-2: the scores are
# recomputed from the saved log-sum-exp), each taking the problems its refusal() accepts.
_CHUNKED_PATHS = {"bias_slabs": "fused kernel, bias in row slabs", "softcap_loop": "soft-cap loop, fixed shift"}


def _path(kernel, p, paths: dict) -> str | None:
    """The description of the first of ``paths`` (submodules of ``kernel``) that takes ``p``, else None."""
    for name, what in paths.items():
        path = getattr(kernel, name, None)
        if path is not None and path.refusal(p) is None:
            return what
    return None


def _band(p) -> bool:
    """Whether the block-sparse kernel hands this problem to its band path (a mask ``lo <= j - i <= hi``)."""
    return _path(blocksparse, p, {"window_band": "band"}) is not None


def _blocksparse(t: Tally, label, p, grad, s_grads, o_grads, pairwise) -> int:
    """The block-sparse kernel's products over its own slab plan (``kernels.blocksparse.plan``).

    Each slab of ``n`` query blocks is computed against ``w`` gathered key blocks (its widest
    row's width, padding lanes included). Plain softmax attention runs fused (torch's fused kernel
    per slab, or the hand-written path): the same products, scores recomputed in the backward. Any
    other score or normaliser runs through autograd; when the computed scores exceed the kernel's
    ``BUDGET`` every slab is checkpointed and its score product runs again in the backward (torch's
    checkpoint stops recomputing once every saved tensor is back, so the output product, whose
    result nothing saves, is not re-run).
    """
    batch, heads, _, _, d, dv = p.sizes
    bs = blocksparse.choose_block_size(p)
    shapes = [tuple(slab[1].shape) for slab in blocksparse.plan(p, bs)]  # (n, w) per slab
    computed = sum(n * w for n, w in shapes) * batch * heads * bs * bs
    if blocksparse.blocksparse_softmax.applies(p):
        t.fused(f"{label}attention (active blocks)", 2 * computed * (d + dv), 2 * computed * (3 * d + 2 * dv),
                grad=grad)
        return computed
    recompute = grad and computed > blocksparse.BUDGET
    for n, w in shapes:
        if pairwise:
            t.mm(f"{label}scores (q k^T, active blocks)", batch * heads * n, bs, d, w * bs, grads=s_grads,
                 recompute=recompute)
        t.mm(f"{label}weights @ v (active blocks)", batch * heads * n, bs, w * bs, dv, grads=o_grads)
    return computed


def _window_band(t: Tally, label, p, d, dv, grad) -> int:
    """The band kernel: a ``bs x W`` window of scores per query block; its backward recomputes the scores."""
    from ...kernels import window_band

    batch, heads = p.sizes[:2]
    pl = window_band.plan(p)
    pairs = batch * heads * pl.nq * pl.bs * pl.width
    t.fused(f"{label}attention (band windows)", 2 * pairs * (d + dv), 2 * pairs * (3 * d + 2 * dv), grad=grad)
    return pairs
