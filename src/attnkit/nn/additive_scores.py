"""The additive (Bahdanau) score ``v^T tanh(q_i + k_j)`` in bounded memory, forward and backward.

Bahdanau et al. 2015 (arXiv:1409.0473, eq. A.1.2) with the projections already
applied: ``e_ij = sum_a v_a tanh(q_ia + k_ja)``. The ``(N, Lq, Lk, A)`` hidden tensor
is built a tile at a time in one reused buffer, and the backward recomputes each
tile instead of saving it.

``tanh`` is the cost (about 3 ns an element on one AVX2 core; an add or a
multiply is 0.12 ns). With ``tanh(x) = 2 G - 1``, ``G = sigmoid(2x) = 1 / (1 + exp(-2x))``
and ``exp(-2 (q + k)) = exp(-2q) exp(-2k)``, a tile needs no transcendental function
at all: ``exp(-2q)`` and ``exp(-2k)`` are computed once per call, and each tile is
``G = 1 / (1 + Eq_i * Ek_j)`` (``addcmul``, ``reciprocal``). The affine parts go into
the matrix-vector products, and ``1 - tanh^2 = 4 G (1 - G)``::

    e_ij = (2 v)^T (G_ij - 1/2)
    dv = 2 sum_ij g_ij G_ij - sum_ij g_ij
    dq_i = 4 v * sum_j g_ij G_ij (1 - G_ij),   dk_j = 4 v * sum_i g_ij G_ij (1 - G_ij)

A forward tile is four passes (``addcmul``, ``reciprocal``, ``- 1/2``, one GEMV with
``2 v``); a backward tile six (``addcmul``, ``reciprocal``, one GEMV for ``dv``,
``g G (1 - G)`` in one pass (``aten.sigmoid_backward``), a sum over keys and one
over queries). Subtracting 1/2 before the GEMV (exact) keeps the score's rounding
that of plain ``tanh(.) @ v``. When ``|2q|`` or ``|2k|`` is too large for
``exp`` to stay a normal float (above 83 in float32), or the values are not
finite, tiles use ``G = sigmoid(2q_i + 2k_j)`` instead (an add and a sigmoid).
Either way ``G`` near 1/2 carries an absolute rounding error of about ``eps``
rather than ``eps |tanh|``; tests/nn/test_additive_scores.py holds both forms to
the DESIGN.md rule against plain float32 ``tanh``. Half-precision inputs are
computed in float32.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

__all__ = ["DEFAULT_MAX_ELEMENTS", "TILE", "additive_scores"]

DEFAULT_MAX_ELEMENTS = 1 << 22  # hidden-tensor elements alive at once (16 MiB in float32)
TILE = 1 << 20  # hidden elements per tile of the tiled path: one reused buffer

_sigmoid_backward = torch.ops.aten.sigmoid_backward.grad_input  # grad * G * (1 - G), one pass


def _tile(q, k, v):
    return torch.tanh(q.unsqueeze(-2) + k.unsqueeze(-3)) @ v  # (..., Lq, Lk, A) -> (..., Lq, Lk)


def _tile_shape(q, k, budget: int) -> tuple[int, int, int]:
    """``(leading, rows, cols)`` of a hidden tile: at most ``budget`` elements, but at least one ``A`` vector."""
    (n, lq, a), lk = q.shape, k.shape[1]
    cols = min(lk, max(1, budget // a))
    rows = min(lq, max(1, budget // (cols * a)))
    return min(n, max(1, budget // (rows * cols * a))), rows, cols


def _tiles(q, k, budget: int):
    """Index ranges ``(leading, rows, cols)`` of the ``(N, Lq, Lk, A)`` hidden tensor, tile by tile."""
    (n, lq, _), lk = q.shape, k.shape[1]
    lead, rows, cols = _tile_shape(q, k, budget)
    for n0 in range(0, n, lead):
        for i0 in range(0, lq, rows):
            for j0 in range(0, lk, cols):
                yield slice(n0, n0 + lead), slice(i0, i0 + rows), slice(j0, j0 + cols)


def _factors(q, k):
    """``(exp(-2q), exp(-2k), True)`` when both stay normal floats, else ``(2q, 2k, False)`` (sigmoid tiles)."""
    limit = -math.log(torch.finfo(q.dtype).tiny) - 4.0
    if not torch.compiler.is_compiling() and bool(torch.maximum(q.abs().amax(), k.abs().amax()) * 2 <= limit):
        return torch.exp(q * -2), torch.exp(k * -2), True
    return q * 2, k * 2, False


def _gates(buf, fq, fk, exp_form: bool, tile):
    """``G = sigmoid(2 q_i + 2 k_j)`` of one tile ``(n, rows, cols, A)`` in place in ``buf``, from :func:`_factors`."""
    ns, rs, cs = tile
    qt, kt = fq[ns, rs, None], fk[ns if fk.shape[0] > 1 else slice(0, 1), None, cs]  # (n, rows, 1, A), (n, 1, cols, A)
    shape = (max(qt.shape[0], kt.shape[0]), qt.shape[1], kt.shape[2], fq.shape[2])
    h = buf[:math.prod(shape)].view(shape)
    if exp_form:
        return torch.addcmul(buf.new_ones(()), qt, kt, out=h).reciprocal_()  # 1 / (1 + exp(-2q) exp(-2k))
    return torch.add(qt, kt, out=h).sigmoid_()


class _TiledScores(torch.autograd.Function):
    """``v^T tanh(q_i + k_j)`` for ``q (N, Lq, A)``, ``k (N|1, Lk, A)``, ``v (A,)``, a tile at a time.

    Saves only the ``(N, L, A)`` factors of q and k, and v; the backward recomputes each tile.
    """

    @staticmethod
    def forward(ctx, q, k, v, budget: int):
        n, lq, a = q.shape
        fq, fk, exp_form = _factors(q, k)
        v2 = v * 2
        out, buf = q.new_empty(n, lq, k.shape[1]), q.new_empty(math.prod(_tile_shape(q, k, budget)) * a)
        for tile in _tiles(q, k, budget):
            g = _gates(buf, fq, fk, exp_form, tile).sub_(0.5)  # G - 1/2 = tanh / 2, exactly
            out[tile] = (g.view(-1, a) @ v2).view(g.shape[:3])  # one GEMV per tile
        ctx.save_for_backward(fq, fk, v)
        ctx.budget, ctx.exp_form = budget, exp_form
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        fq, fk, v = ctx.saved_tensors
        a, shared_k = fq.shape[2], fk.shape[0] == 1
        dq, dk, gv = torch.zeros_like(fq), torch.zeros_like(fk), torch.zeros_like(v)
        buf = fq.new_empty(math.prod(_tile_shape(fq, fk, ctx.budget)) * a)
        for tile in _tiles(fq, fk, ctx.budget):
            h = _gates(buf, fq, fk, ctx.exp_form, tile)
            g = grad[tile]  # (n, rows, cols)
            gv += h.view(-1, a).t() @ g.reshape(-1)  # sum_ij g_ij G_ij
            u = _sigmoid_backward(g[..., None].expand(h.shape), h, grad_input=h)  # g G (1 - G), in place
            dq[tile[:2]] += u.sum(2)
            dk[0 if shared_k else tile[0], tile[2]] += u.sum((0, 1)) if shared_k else u.sum(1)
        v4 = v * 4
        return dq.mul_(v4), dk.mul_(v4), gv.mul_(2).sub_(grad.sum()), None


def additive_scores(q, k, v, *, max_elements: int = DEFAULT_MAX_ELEMENTS) -> torch.Tensor:
    """``v^T tanh(q_i + k_j)`` for already projected ``q (..., Lq, A)``, ``k (..., Lk, A)``, ``v (A,)``.

    The ``(..., Lq, Lk, A)`` hidden tensor is never built in one piece when it would
    exceed ``max_elements``: tiles of at most ``min(max_elements, TILE)`` elements are
    computed in place in one reused buffer, and the backward recomputes each tile
    instead of saving it, so neither pass holds more than one tile. Leading dims
    broadcast (pairwise score, usable as ``attnkit.attention(score=...)``).
    """
    v = v.to(q.dtype)
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    lq, lk, a = q.shape[-2], k.shape[-2], q.shape[-1]
    if math.prod(lead) * lq * lk * a <= max_elements:
        return _tile(q, k, v)
    qf = q.expand(*lead, lq, a).reshape(-1, lq, a)
    kf = k.reshape(1, lk, a) if math.prod(k.shape[:-2]) == 1 else k.expand(*lead, lk, a).reshape(-1, lk, a)
    dt = torch.promote_types(q.dtype, torch.float32)  # half types: tiles in float32
    out = _TiledScores.apply(qf.to(dt), kf.to(dt), v.to(dt), max(1, min(max_elements, TILE)))
    return out.to(q.dtype).view(*lead, lq, lk)
