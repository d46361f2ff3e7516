"""Additive (Bahdanau, "concat") attention, and the banded score other modules share."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from ..attention import attention
from ..errors import ArgumentError, ShapeError
from ..functional.validate import validate
from ..registry import Entry, register

__all__ = ["AdditiveAttention", "AdditiveOutput", "additive_scores", "dense_allowed", "key_filter",
           "drop_unseen", "check_input", "check_memory"]

DEFAULT_MAX_ELEMENTS = 1 << 22  # hidden-tensor elements alive at once (16 MiB in float32)
TILE = 1 << 20  # hidden elements per tile of the tiled path: one reused, cache-sized buffer


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


def _hidden(buf, q, k, tile):
    """``tanh(q_i + k_j)`` of one tile ``(n, rows, cols, A)``, computed in place in ``buf``."""
    ns, rs, cs = tile
    qt, kt = q[ns, rs], k[ns if k.shape[0] > 1 else slice(0, 1), cs]
    h = buf[:max(qt.shape[0], kt.shape[0]) * qt.shape[1] * kt.shape[1] * q.shape[2]]
    h = h.view(max(qt.shape[0], kt.shape[0]), qt.shape[1], kt.shape[1], q.shape[2])
    return torch.add(qt[:, :, None], kt[:, None], out=h).tanh_()


class _TiledScores(torch.autograd.Function):
    """``v^T tanh(q_i + k_j)`` for ``q (N, Lq, A)``, ``k (N|1, Lk, A)``: a tile at a time, forward and backward.

    Backward, per tile: ``u = g (1 - t^2)``, ``dq_i = v * sum_j u_ij``, ``dk_j = v * sum_i u_ij``,
    ``dv = sum_ij g_ij t_ij``; the tile is recomputed instead of saved.
    """

    @staticmethod
    def forward(ctx, q, k, v, budget: int):
        n, lq, a = q.shape
        out, buf = q.new_empty(n, lq, k.shape[1]), q.new_empty(math.prod(_tile_shape(q, k, budget)) * a)
        for tile in _tiles(q, k, budget):
            h = _hidden(buf, q, k, tile)
            out[tile] = (h.view(-1, a) @ v).view(h.shape[:3])
        ctx.save_for_backward(q, k, v)
        ctx.budget = budget
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors
        a = q.shape[2]
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        buf = q.new_empty(math.prod(_tile_shape(q, k, ctx.budget)) * a)
        for tile in _tiles(q, k, ctx.budget):
            h = _hidden(buf, q, k, tile)
            g = grad[tile]  # (n, rows, cols)
            dv += h.view(-1, a).t() @ g.reshape(-1)
            u = h.mul_(h).neg_().add_(1).mul_(g[..., None])  # g (1 - t^2), in place
            dq[tile[:2]] += u.sum(2)
            dk[tile[0] if k.shape[0] > 1 else slice(0, 1), tile[2]] += u.sum(1) if k.shape[0] > 1 else u.sum((0, 1))
        return dq * v, dk * v, dv, None


def additive_scores(q, k, v, *, max_elements: int = DEFAULT_MAX_ELEMENTS) -> torch.Tensor:
    """``v^T tanh(q_i + k_j)`` for already projected ``q (..., Lq, A)``, ``k (..., Lk, A)``, ``v (A,)``.

    The ``(..., Lq, Lk, A)`` hidden tensor is never built in one piece when it would
    exceed ``max_elements``: tiles of at most ``min(max_elements, TILE)`` elements are
    computed in place in one reused buffer, and the backward recomputes each tile
    (``g (1 - t^2)`` summed over keys and over queries) instead of saving it, so
    neither pass holds more than one tile. Leading dims broadcast (pairwise score,
    usable as ``attnkit.attention(score=...)``).
    """
    v = v.to(q.dtype)
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    lq, lk, a = q.shape[-2], k.shape[-2], q.shape[-1]
    if math.prod(lead) * lq * lk * a <= max_elements:
        return _tile(q, k, v)
    qf = q.expand(*lead, lq, a).reshape(-1, lq, a)
    kf = k.reshape(1, lk, a) if math.prod(k.shape[:-2]) == 1 else k.expand(*lead, lk, a).reshape(-1, lk, a)
    return _TiledScores.apply(qf, kf, v, max(1, min(max_elements, TILE))).view(*lead, lq, lk)


def check_input(who: str, name: str, t, dim: int) -> None:
    """Raise :class:`~attnkit.errors.ShapeError` unless ``t`` is ``(batch, length, dim)``."""
    if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.shape[-1] != dim:
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ShapeError(f"{who}: {name} must have shape (batch, length, {dim}); got {got}")


def check_memory(who: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor | None = None,
                 key_name: str = "key") -> None:
    """Batch sizes of query and key (and value) agree; value is ``(batch, key_len, *)``."""
    if query.shape[0] != key.shape[0]:
        raise ShapeError(f"{who}: query and {key_name} must share the batch size; got query {tuple(query.shape)} "
                         f"and {key_name} {tuple(key.shape)}")
    if value is not None and (not isinstance(value, torch.Tensor) or value.dim() != 3
                              or value.shape[:2] != key.shape[:2]):
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ShapeError(f"{who}: value must have shape (batch, key_len, value_dim) = ({key.shape[0]}, "
                         f"{key.shape[1]}, ...); got {got}")


def dense_allowed(mask, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
    """A mask (an :mod:`attnkit.masks` mask or bool tensor, True = attend) as a bool ``(B|1, Lq|1, Lk)``.

    Validated exactly as :func:`attnkit.attention` validates ``mask=`` for 3-D inputs.
    """
    if mask is None:
        return None
    p = validate(query[..., :0], key[..., :0], key[..., :0], mask=mask, score="dot")  # features play no part
    b, _, lq, lk, _, _ = p.sizes
    return p.mask.materialize(lq, lk, batch=b, heads=1, device=query.device)[:, 0]


def drop_unseen(allowed: torch.Tensor | None, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Zero the key rows ``(B, Lk, .)`` that ``allowed (B|1, Lq|1, Lk)`` hides from every query.

    Done before scoring, so NaN/inf in padding reaches neither the output nor the
    gradients through ``0 * NaN`` (RELIABILITY row 22).
    """
    if allowed is None:
        return tensors
    hidden = ~allowed.any(-2)[..., None]  # (B|1, Lk, 1)
    return tuple(t.masked_fill(hidden, 0.0) for t in tensors)


def key_filter(mask, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
    """The keys a mask hides from every query whatever the query (padding) as ``(B|1, 1, Lk)``, else None.

    ``O(B Lk)``: never builds the ``(Lq, Lk)`` picture, unlike :func:`dense_allowed`.
    """
    if mask is None:
        return None
    keys = validate(query[..., :0], key[..., :0], key[..., :0], mask=mask, score="dot").mask.key_filter()
    if keys is None:
        return None
    return keys.materialize(1, key.shape[1], batch=key.shape[0], heads=1, device=key.device)[:, 0]


class AdditiveOutput(NamedTuple):
    """context ``(B, Lq, Dv)``; weights ``(B, Lq, Lk)`` (None unless asked)."""

    context: torch.Tensor
    weights: torch.Tensor | None


class AdditiveAttention(nn.Module):
    """Additive attention: ``softmax_j(v^T tanh(W_q q_i + W_k k_j)) @ value``.

    Bahdanau, Cho & Bengio 2015, "Neural Machine Translation by Jointly Learning to
    Align and Translate", ICLR, arXiv:1409.0473, eqs. 5-6 and Appendix A.1.2::

        e_ij = v_a^T tanh(W_a s_{i-1} + U_a h_j),   alpha_ij = softmax_j(e_ij),   c_i = sum_j alpha_ij h_j

    This is also Luong et al.'s "concat" score, ``v_a^T tanh(W_a [h_t; h_s])``.
    Notation: ``s_{i-1}`` = ``query[:, i]``, ``h_j`` = ``key[:, j]`` (and ``value[:, j]``),
    ``W_a`` = ``query_proj.weight``, ``U_a`` = ``key_proj.weight``, ``v_a`` = ``v``.

    Differences from the paper: queries are given as a tensor (all decoder steps at
    once, or one step with ``Lq = 1``) instead of coming from the decoder's recurrence;
    masks; optional bias inside the tanh (``bias=True``); dropout on the weights.

    Memory: the ``(B, Lq, Lk, hidden)`` tensor is built a tile at a time in one reused
    buffer, forward and backward (see :func:`additive_scores`); with ``need_weights=False``
    the chunked kernel is allowed too, so nothing of size ``Lq x Lk`` need exist at once.
    At B=32, Lq=Lk=512, hidden=256 the forward peaks near 0.2 GiB where the broadcast
    ``tanh(q[:, :, None] + k[:, None]) @ v`` holds 16 GiB, and takes about half its time
    (the tanh is the cost).

    Shapes:
        query ``(B, Lq, query_dim)``, key ``(B, Lk, key_dim)``, value ``(B, Lk, Dv)``
        (default: key) -> context ``(B, Lq, Dv)``, weights ``(B, Lq, Lk)``.

    Complexity: ``O(B Lq Lk hidden)`` time; ``O(max_elements)`` extra memory for the scores' hidden tensor.

    Args:
        query_dim: features of a query (decoder state).
        key_dim: features of a key (annotation); default ``query_dim``.
        hidden_dim: size of ``v_a`` (the hidden layer); default ``query_dim``.
        bias: add a learned bias inside the tanh.
        dropout: dropout on the weights, applied only in training (returned weights are pre-dropout).
        max_elements: hidden-tensor elements built at once.

    Example:
        >>> import torch
        >>> from attnkit.nn.additive import AdditiveAttention
        >>> _ = torch.manual_seed(0)
        >>> attn = AdditiveAttention(4, 6, 8)
        >>> context, weights = attn(torch.randn(2, 3, 4), torch.randn(2, 5, 6))
        >>> context.shape, weights.shape
        (torch.Size([2, 3, 6]), torch.Size([2, 3, 5]))
        >>> torch.allclose(weights.sum(-1), torch.ones(2, 3))
        True
    """

    def __init__(self, query_dim: int, key_dim: int | None = None, hidden_dim: int | None = None, *,
                 bias: bool = False, dropout: float = 0.0, max_elements: int = DEFAULT_MAX_ELEMENTS):
        super().__init__()
        key_dim = query_dim if key_dim is None else key_dim
        hidden_dim = query_dim if hidden_dim is None else hidden_dim
        if not 0.0 <= dropout < 1.0:
            raise ArgumentError(f"AdditiveAttention: dropout must be in [0, 1); got {dropout!r}")
        if max_elements < 1:
            raise ArgumentError(f"AdditiveAttention: max_elements must be >= 1; got {max_elements!r}")
        self.query_dim, self.key_dim, self.dropout, self.max_elements = query_dim, key_dim, dropout, max_elements
        self.query_proj = nn.Linear(query_dim, hidden_dim, bias=bias)
        self.key_proj = nn.Linear(key_dim, hidden_dim, bias=False)
        self.v = nn.Parameter(torch.empty(hidden_dim).uniform_(-hidden_dim ** -0.5, hidden_dim ** -0.5))

    def score(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """Unmasked scores ``e`` of shape ``(B, Lq, Lk)``."""
        return additive_scores(self.query_proj(query), self.key_proj(key), self.v, max_elements=self.max_elements)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor | None = None, *,
                mask=None, need_weights: bool = True) -> AdditiveOutput:
        """Attend; ``mask`` is an :mod:`attnkit.masks` mask or bool tensor, True = attend.

        A query with no allowed key gets context 0 and weights 0.
        """
        value = key if value is None else value
        check_input("AdditiveAttention", "query", query, self.query_dim)
        check_input("AdditiveAttention", "key", key, self.key_dim)
        check_memory("AdditiveAttention", query, key, value)
        key, value = drop_unseen(key_filter(mask, query, key), key, value)  # before W_k: no 0 * NaN in its grad
        fn = lambda q, k: additive_scores(q, k, self.v, max_elements=self.max_elements)
        out = attention(self.query_proj(query), self.key_proj(key), value, mask=mask, score=fn, scale=1.0,
                        dropout_p=self.dropout if self.training else 0.0, return_weights=need_weights)
        return AdditiveOutput(out.output, out.weights) if need_weights else AdditiveOutput(out, None)


def _example():
    g = torch.Generator().manual_seed(0)
    return AdditiveAttention(8, 6, 16), (torch.randn(2, 5, 8, generator=g), torch.randn(2, 7, 6, generator=g))


register(Entry("additive", AdditiveAttention, "Bahdanau et al. 2015, arXiv:1409.0473, eq. 6 and A.1.2",
               "O(Lq Lk A)", "v^T tanh(W_q q + W_k k) scores (also Luong's concat), memory-bounded",
               family="module", example=_example))
