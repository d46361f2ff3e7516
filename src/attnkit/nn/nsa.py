"""Native Sparse Attention (NSA): compressed blocks, selected blocks and a sliding window, gated."""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import masks
from ..core import attention
from ..costing.attend import attend
from ..costing.spec import Spec
from ..costing.tally import dtype_of, randn
from ..errors import ArgumentError, ShapeError, check_int
from ..masks.selected import SelectedKeys
from ..recording import is_recording
from ..registry.entry import Entry, register
from ._inputs import check_sequence

__all__ = ["NativeSparseAttention", "compressed_attention", "compressed_and_blocks", "nsa_blocks"]

_INF = float("inf")
_ROWS = 1 << 22  # selection scores (queries x compressed blocks x heads) computed at once
_TRIANGLE = 512  # queries per chunk at most: each chunk scores only the blocks its last query has seen


class _Compress(nn.Module):
    """phi: a block of ``l`` keys (or values) with an intra-block position embedding, mapped to one vector."""

    def __init__(self, length: int, stride: int, head_dim: int):
        super().__init__()
        self.length, self.stride = length, stride
        self.position = nn.Parameter(torch.randn(length, head_dim) * head_dim ** -0.5)
        self.proj = nn.Linear(length * head_dim, head_dim)

    def forward(self, k: torch.Tensor) -> torch.Tensor:
        """``(B, H, n, D)`` -> ``(B, H, n_c, D)``, ``n_c = floor((n - l) / d) + 1`` blocks (0 if ``n < l``).

        ``W vec(K_i + P) + b = W vec(K_i) + (W vec(P) + b)``. Block ``i`` is the ``m = l / d`` chunks of ``d``
        keys ``i .. i + m - 1``, so with ``W = [W_0 .. W_{m-1}]`` cut by chunk, ``W vec(K_i) = sum_j W_j vec(C_{i+j})``:
        ``m`` matrix products over one view of the keys as chunks ``(n / d, d D)``, each over ``n_c`` consecutive
        chunks (no ``(n_c, l, D)`` copy of the overlapping blocks, no convolution)."""
        batch, heads, n, d = k.shape
        if n < self.length:
            return k.new_zeros(batch, heads, 0, d)
        out_dim, m, stride = self.proj.out_features, self.length // self.stride, self.stride
        blocks_c = (n - self.length) // stride + 1
        bias = self.proj.weight @ self.position.flatten() + self.proj.bias
        chunks = k[:, :, :(blocks_c + m - 1) * stride].reshape(batch * heads, blocks_c + m - 1, stride * d)
        taps = self.proj.weight.view(out_dim, m, stride * d).transpose(0, 1).transpose(1, 2)  # (m, d D, D_out)
        out = bias.expand(batch * heads, blocks_c, out_dim)
        for j in range(m):  # (B H, n_c, d D) views of the chunks j .. j + n_c - 1 (strided rows: no copy)
            out = torch.baddbmm(out, chunks[:, j:j + blocks_c], taps[j].expand(batch * heads, -1, -1))
        return out.view(batch, heads, blocks_c, out_dim)


def compressed_attention(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, *, length: int,
                         stride: int) -> torch.Tensor:
    """NSA's compressed branch (eq. 7 keys, causal by ended blocks) as one dense causal call: ``(B, H, n, Dv)``.

    Query ``t`` sees compressed block ``i`` once it has ended, ``i d + l - 1 <= t``. Writing ``t = l - 1 + s d + r``
    (``0 <= r < d``), query ``t`` sees the blocks ``0 .. s``: taking the ``d`` phases ``r`` as query heads of a
    grouped-query call (each reads its head's compressed keys), the rows ``s = 0 .. n_c - 1`` over the ``n_c``
    blocks are plain causal attention, square, so torch's kernel skips the blocks above the diagonal and no mask
    tensor is made. The first ``l - 1`` queries see no block: their output is 0.
    """
    batch, heads, n, d = q.shape
    blocks_c, dv = k_cmp.shape[2], v_cmp.shape[-1]
    first = length - 1
    if not blocks_c:
        return q.new_zeros(batch, heads, n, dv)
    rows = blocks_c * stride  # >= n - l + 1: the queries that see a block, padded to whole phases
    qs = F.pad(q[:, :, first:], (0, 0, 0, rows - (n - first)))
    qs = qs.view(batch, heads, blocks_c, stride, d).transpose(2, 3).reshape(batch, heads * stride, blocks_c, d)
    out = attention(qs, k_cmp, v_cmp, mask=masks.causal())  # (B, H d, n_c, Dv): query head h d + r, key head h / g
    out = out.view(batch, heads, stride, blocks_c, dv).transpose(2, 3).reshape(batch, heads, rows, dv)
    return F.pad(out[:, :, :n - first], (0, 0, first, 0))


class _CompressedBranch(torch.autograd.Function):
    """The compressed branch's output, computed with the selection (:func:`compressed_and_blocks`), joined to
    autograd; the backward (:func:`_compressed_grads`) recomputes the probabilities from that output's lse."""

    @staticmethod
    def forward(ctx, q, k_cmp, v_cmp, out, lse, length: int, stride: int, scale: float):
        ctx.save_for_backward(q, k_cmp, v_cmp, out, lse)
        ctx.length, ctx.stride, ctx.scale = length, stride, scale
        return out.view_as(out)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k_cmp, v_cmp, out, lse = ctx.saved_tensors
        grads = _compressed_grads(q, k_cmp, v_cmp, out, lse, dout, length=ctx.length, stride=ctx.stride,
                                  scale=ctx.scale)
        return (*grads, None, None, None, None, None)


def _compressed_grads(q, k_cmp, v_cmp, out, lse, dout, *, length: int, stride: int, scale: float):
    """``dq, dk_cmp, dv_cmp`` of the compressed branch (Dao 2023, arXiv:2307.08691, Alg. 2 by chunks of rows):
    ``P = exp(S - lse)`` over the blocks each row has seen ended, ``dV = P^T dO``, ``dS = P (dO V^T - rowsum(dO o O))``,
    ``dQ = scale dS K``, ``dK = scale dS^T Q``. A chunk scores only the blocks its last query has seen (the causal
    triangle, as the forward), a group's heads as rows of one product; the first ``l - 1`` rows see no block."""
    batch, heads, n, d = q.shape
    kv_heads, blocks_c, dv = k_cmp.shape[1], k_cmp.shape[2], v_cmp.shape[-1]
    group = heads // kv_heads
    dq, dk, dvc = torch.zeros_like(q), torch.zeros_like(k_cmp), torch.zeros_like(v_cmp)
    delta = (dout * out).sum(-1)  # (B, H, n)
    rows = max(1, min(_TRIANGLE, _ROWS // max(1, batch * heads * (blocks_c + -(-n // stride)))))
    for r0 in range(length - 1, n, rows):
        r1 = min(n, r0 + rows)
        c, seen = r1 - r0, min(blocks_c, (r1 - length) // stride + 1)  # the blocks ended by the chunk's last query
        t = torch.arange(r0, r1, device=q.device)[:, None]
        full = _ended_by(r0, length, stride, seen)  # the blocks every row of the chunk has seen: no mask there
        ended = torch.arange(full, seen, device=q.device) * stride + length - 1 <= t
        kc, vc = k_cmp[:, :, :seen], v_cmp[:, :, :seen]
        qc = q[:, :, r0:r1].reshape(batch, kv_heads, group * c, d)
        do = dout[:, :, r0:r1].reshape(batch, kv_heads, group * c, dv)
        p = (qc @ kc.transpose(-1, -2)).mul_(scale).view(batch, kv_heads, group, c, seen)
        p[..., full:].masked_fill_(~ended, -_INF)
        p = p.sub_(lse[:, :, r0:r1].reshape(batch, kv_heads, group, c, 1)).exp_().view(batch, kv_heads, group * c, seen)
        dvc[:, :, :seen] += p.transpose(-1, -2) @ do
        ds = (do @ vc.transpose(-1, -2)).sub_(delta[:, :, r0:r1].reshape(batch, kv_heads, group * c, 1)).mul_(p)
        dq[:, :, r0:r1] = (ds @ kc).mul_(scale).view(batch, heads, c, d)
        dk[:, :, :seen] += (ds.transpose(-1, -2) @ qc).mul_(scale)
    return dq, dk, dvc


def _ended_by(t: int, length: int, stride: int, blocks_c: int) -> int:
    """How many compressed blocks (of ``blocks_c``) query ``t`` has seen ended: ``i d + l - 1 <= t``."""
    return min(blocks_c, max(0, (t - length + 1) // stride + 1))


def _one_pass(q: torch.Tensor, k_cmp: torch.Tensor) -> bool:
    """The compressed branch computed with the selection (:class:`_CompressedBranch`): on the CPU, float32 or
    float64 (the softmax written out, as the dense formulas run there), some compressed block."""
    return (q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64) and k_cmp.dtype == q.dtype
            and k_cmp.shape[2] > 0)


def nsa_blocks(q: torch.Tensor, k_cmp: torch.Tensor, *, length: int, stride: int, block: int, count: int,
               scale: float, start: int = 0) -> torch.Tensor:
    """The selection blocks of every query, shared by each key/value head's group: ``(B, H_kv, n, count)``.

    Yuan et al. 2025, arXiv:2502.11089, eq. 8-11: ``p_cmp = softmax(q K_cmp^T)`` over the ended compressed
    blocks; a selection block's importance sums, over its ``block / stride`` chunks of ``stride`` keys, the
    importance of every compressed block holding that chunk (eq. 9); the heads of a group add theirs (eq. 10);
    the top ``count`` blocks are kept (eq. 11), the first block and the two blocks ending at the query
    always among them, blocks after the query never (``-1``: fewer blocks to choose). No gradient.

    Eq. 10 is linear in ``p_cmp``: the group's probabilities are summed first, then eq. 9's chunk sums run once
    per group, batched over heads and queries (``q`` a chunk of rows at a time: no ``n x n`` tensor).

    ``start``: the position of the first query (a decoding step over a cache: its length minus one); the keys
    are those of positions ``0 .. start + n - 1``.
    """
    return _scored(q, k_cmp, None, length=length, stride=stride, block=block, count=count, scale=scale,
                   start=start)[0]


def compressed_and_blocks(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, *, length: int, stride: int,
                          block: int, count: int, scale: float):
    """The compressed branch and the selection from one softmax (eq. 7-11: ``p_cmp`` is the compressed branch's
    attention): ``(out (B, H, n, Dv), lse (B, H, n), blocks (B, H_kv, n, count))``, no gradient.

    ``out = p_cmp V_cmp`` (0 and lse ``-inf`` for the first ``l - 1`` queries, which see no ended block), the
    blocks as :func:`nsa_blocks` chooses them; the scores are computed once, a chunk of rows at a time."""
    chosen, out, lse = _scored(q, k_cmp, v_cmp, length=length, stride=stride, block=block, count=count, scale=scale)
    return out, lse, chosen


def _scored(q, k_cmp, v_cmp, *, length, stride, block, count, scale, start=0):
    """:func:`nsa_blocks` (``v_cmp`` None) or :func:`compressed_and_blocks`, over chunks of rows."""
    with torch.no_grad():
        batch, heads, n, _ = q.shape
        kv_heads, blocks_c, total = k_cmp.shape[1], k_cmp.shape[2], start + n
        rows = max(1, min(_TRIANGLE, _ROWS // max(1, batch * heads * (blocks_c + -(-total // stride)))))
        parts = [_select_rows(q[:, :, r0:r0 + rows], k_cmp, v_cmp, start + r0, total, length=length, stride=stride,
                              block=block, count=count, scale=scale) for r0 in range(0, n, rows)]
        if not parts:
            chosen = q.new_zeros(batch, kv_heads, 0, 0, dtype=torch.long)
            return chosen, q.new_zeros(batch, heads, 0, 0 if v_cmp is None else v_cmp.shape[-1]), q.new_zeros(
                batch, heads, 0)
        return tuple(torch.cat(t, 2) if t[0] is not None else None for t in zip(*parts, strict=True))


def _select_rows(q, k_cmp, v_cmp, r0: int, total: int, *, length, stride, block, count, scale):
    """:func:`_scored` for the queries ``r0 .. r0 + c - 1`` of ``total`` (``q`` ``(B, H, c, D)``): scores
    ``c x n_c'`` over the ``n_c'`` blocks ended by the last of them (a causal triangle: half the products); with
    ``v_cmp`` also the compressed branch's rows ``p V_cmp`` and their lse (rows with no ended block: 0, ``-inf``)."""
    batch, heads, rows, d = q.shape
    kv_heads = k_cmp.shape[1]
    blocks_c = max(0, min(k_cmp.shape[2], (r0 + rows - length) // stride + 1))  # ended by the chunk's last query
    k_cmp = k_cmp[:, :, :blocks_c]  # the later blocks no query of the chunk sees: not scored
    group = heads // kv_heads
    t = torch.arange(r0, r0 + rows, device=q.device)[:, None]
    full = _ended_by(r0, length, stride, blocks_c)  # the blocks every query of the chunk has seen: no mask there
    ended = torch.arange(full, blocks_c, device=q.device) * stride + length - 1 <= t
    scores = (q.reshape(batch, kv_heads, group * rows, d) * scale) @ k_cmp.transpose(-1, -2)  # a group's heads as rows
    scores = scores.view(batch, kv_heads, group, rows, blocks_c)
    scores[..., full:].masked_fill_(~ended, -_INF)
    out = lse = None
    if v_cmp is None or not blocks_c:
        p = torch.softmax(scores, -1).nan_to_num_(0.0)
        if v_cmp is not None:
            out, lse = q.new_zeros(batch, heads, rows, v_cmp.shape[-1]), q.new_full((batch, heads, rows), -_INF)
    else:  # softmax written out, for its lse: the compressed branch's backward (_compressed_grads) reads it
        top = scores.amax(-1, keepdim=True)
        p = scores.sub_(top).exp_()
        norm = p.sum(-1, keepdim=True)
        p = p.div_(norm)  # rows with no ended block: NaN (-inf - -inf), zeroed below
        out = (p @ v_cmp[:, :, None, :blocks_c]).view(batch, heads, rows, -1)
        lse = top.add_(norm.log_()).view(batch, heads, rows)
        seen = t[:, 0] >= length - 1  # block 0 ended
        if not bool(seen.all()):
            out, lse = out.masked_fill_(~seen[:, None], 0.0), lse.masked_fill_(~seen, -_INF)
        p = p.nan_to_num_(0.0)
    chosen = _top_blocks(p, r0 if rows == 1 else t, r0 + rows - 1, total, length=length, stride=stride, block=block,
                         count=count)
    return chosen, out, lse


def _top_blocks(p, t, last: int, total: int, *, length, stride, block, count) -> torch.Tensor:
    """Eq. 9-11 from the compressed blocks' probabilities ``p`` ``(B, H_kv, g, c, n_c')`` of the queries at positions
    ``t`` ``(c, 1)`` (or the int ``last`` when ``c = 1``), the last at ``last`` (``n_c'`` the blocks it has seen
    ended), of ``total`` keys: the ``(B, H_kv, c, min(count, every))`` blocks chosen (``-1``: none left; ``every``
    the blocks of ``total`` keys). The forced blocks rank the query's own first, then the one before, then the
    first (which of them ``count < 3`` keeps is fixed: a decoding step keeps what the whole sequence's call keeps).
    For one query (``t`` an int) the blocks come in rank order, the forced ones first."""
    batch, kv_heads, _, rows, blocks_c = p.shape
    p = p.squeeze(2) if p.shape[2] == 1 else p.sum(2)  # eq. 10: the group's heads add theirs
    step, every, per = block // stride, -(-total // block), length // stride
    blocks = min(every, last // block + 1)  # up to the last query's own block: the later ones
    # are -inf for every query of the chunk (a causal triangle: half the columns on average)
    # eq. 9: compressed block i holds the chunks i .. i + per - 1, so selection block j sums the compressed blocks
    # j step - per + 1 .. j step + step - 1, block j step - per + 1 + w weighted by the chunks it shares with block j:
    # one window of step + per - 1 compressed blocks every step: for each place i in the window, the compressed
    # blocks j step - per + 1 + i of every j (a strided view of p) times that weight, added in place
    importance = p.new_zeros(batch, kv_heads, rows, blocks)
    for i in range(step + per - 1):
        off, weight = i - per + 1, min(i, step - 1) - max(i - per + 1, 0) + 1
        j0, j1 = -(off // step) if off < 0 else 0, min(blocks, (blocks_c - 1 - off) // step + 1)
        if j1 > j0:
            importance[..., j0:j1].add_(p[..., j0 * step + off:(j1 - 1) * step + off + 1:step], alpha=weight)
    if isinstance(t, int):  # one query: every column a block it has seen, its own the last; the forced ranks added
        importance = importance.add_(_forced_ranks(blocks, importance.dtype, importance.device))
        idx = importance.topk(min(count, blocks), dim=-1)[1]  # sorted: the forced blocks first, in rank order
        return idx if idx.shape[-1] == min(count, every) else F.pad(idx, (0, min(count, every) - idx.shape[-1]),
                                                                     value=-1)
    own, column = t // block, torch.arange(blocks, device=p.device)
    big = torch.finfo(importance.dtype).max  # past any importance (a sum of probabilities): the forced blocks' ranks
    importance = (importance.masked_fill_(column == 0, big / 2).masked_fill_(column == own - 1, big)
                  .masked_fill_(column == own, _INF).masked_fill_(column > own, -_INF))
    values, idx = importance.topk(min(count, blocks), dim=-1, sorted=False)
    idx = idx.masked_fill_(values == -_INF, -1)
    return F.pad(idx, (0, min(count, every) - idx.shape[-1]), value=-1)  # the columns of every chunk


@functools.lru_cache(maxsize=32)
def _forced_ranks(blocks: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Added to the importance of a query whose own block is the last of ``blocks``: its own block ``+inf``, the one
    before the largest finite number, the first half of it (past any importance, a sum of probabilities)."""
    big = torch.finfo(dtype).max
    ranks = torch.zeros(blocks, dtype=dtype, device=device)
    ranks[0] = big / 2
    ranks[max(blocks - 2, 0)] = big
    ranks[blocks - 1] = _INF
    return ranks


class _Gate(torch.autograd.Function):
    """``g o`` (``g`` ``(B, H, n, 1)``, ``o`` ``(B, H, n, D)``) whose gradient for ``o`` is made contiguous in ``o``'s
    layout: the output gradient arrives as a transposed view of the output projection's, and the attention paths'
    backward would each copy it again."""

    @staticmethod
    def forward(ctx, g, o):
        ctx.save_for_backward(g, o)
        return g * o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        g, o = ctx.saved_tensors
        dg = (grad * o).sum(-1, keepdim=True) if ctx.needs_input_grad[0] else None
        do = torch.mul(grad, g, out=torch.empty_like(o, memory_format=torch.contiguous_format)) \
            if ctx.needs_input_grad[1] else None
        return dg, do


def _gated(g: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """``g o`` (:class:`_Gate`); plain ``g * o`` under ``torch.func`` transforms, which a custom Function without
    ``vmap`` support cannot serve."""
    return _Gate.apply(g, o) if torch.is_grad_enabled() and (g.requires_grad or o.requires_grad) else g * o


class _Recomputed(torch.autograd.Function):
    """``fn(x)`` keeping only ``x``: the backward runs ``fn`` again with autograd (activation checkpointing, without
    ``torch.utils.checkpoint``, whose first call imports ``torch._dynamo``: about 70 MiB and a second). ``params``:
    the parameters ``fn`` reads, so that they receive their gradients."""

    @staticmethod
    def forward(ctx, fn, x, *params):
        ctx.fn = fn
        ctx.save_for_backward(x, *params)
        with torch.no_grad():
            return fn(x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        x, *params = ctx.saved_tensors
        x = x.detach().requires_grad_(ctx.needs_input_grad[1])
        wanted = [t for t, need in zip([x, *params], ctx.needs_input_grad[1:], strict=True) if need]
        with torch.enable_grad():
            found = iter(torch.autograd.grad(ctx.fn(x), wanted, grads, allow_unused=True) if wanted else ())
        return (None, *(next(found) if need else None for need in ctx.needs_input_grad[1:]))


class NativeSparseAttention(nn.Module):
    """Native Sparse Attention: three gated branches over compressed, selected and nearby keys (causal).

    Yuan et al. 2025, arXiv:2502.11089, eq. 5-12::

        o_t = sum_{c in {cmp, slc, win}} g_t^c Attn(q_t, K_t^c, V_t^c),    g_t^c = sigmoid(MLP(x_t))

    - cmp: blocks of ``l = compress_block`` keys every ``d = compress_stride`` positions, each
      compressed to one key (and value) by ``phi``, a linear map of the block plus an intra-block
      position embedding (eq. 7); a query sees the blocks that have ended;
    - slc: the ``n = num_selected`` blocks of ``l' = select_block`` keys whose importance (eq. 8-11,
      :func:`nsa_blocks`) is highest, one choice per key/value group (grouped-query attention);
    - win: the last ``w = window`` keys.

    The three branches have their own keys and values (Sec. 3.3.3). Notation: ``g`` gates,
    ``H``/``H_kv`` heads.

    Differences from the paper: ``phi`` is one linear layer over the block (the paper's MLP has
    an unnamed depth); eq. 9's index ``(l'/d) j - m - n`` is read as ``(l'/d) j + m - n``, so the
    compressed blocks summed are those overlapping selection block ``j``. The selected branch runs
    on attnkit's selected-blocks path (each query's own block in place, its past blocks in tiles of
    queries sharing a block, merged by log-sum-exp: time and memory ``O(n n_sel l' D)``); the compressed branch and
    the selection share one softmax ``p_cmp`` on the CPU in float32/float64 (:func:`compressed_and_blocks`, a chunk
    of queries at a time over the blocks it has seen, the backward by the same chunks), elsewhere the branch is one
    dense causal call (:func:`compressed_attention`) beside :func:`nsa_blocks`; no ``n x n`` tensor.

    Shapes:
        ``x`` ``(B, n, dim)`` -> ``(B, n, dim)``.

    Complexity:
        ``O(B H n (n / d + n_sel l' + w) D)`` for the three branches.

    Args:
        dim: model width.
        num_heads: query heads ``H`` (``dim % H == 0``).
        kv_heads: key/value heads (default ``H``); a selection is shared by ``H / kv_heads`` heads.
        compress_block: ``l``, a multiple of ``compress_stride``.
        compress_stride: ``d``.
        select_block: ``l'``, a multiple of ``compress_stride``.
        num_selected: ``n`` selected blocks (the first and two local ones included).
        window: ``w`` keys of the sliding window.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> layer = NativeSparseAttention(16, 4, kv_heads=2, compress_block=4, compress_stride=2,
        ...                               select_block=4, num_selected=3, window=5)
        >>> layer(torch.randn(2, 13, 16)).shape
        torch.Size([2, 13, 16])
    """

    def __init__(self, dim: int, num_heads: int, *, kv_heads: int | None = None, compress_block: int = 32,
                 compress_stride: int = 16, select_block: int = 64, num_selected: int = 16, window: int = 512):
        super().__init__()
        who = type(self).__name__
        self.dim, self.num_heads = check_int(who, "dim", dim, 1), check_int(who, "num_heads", num_heads, 1)
        self.kv_heads = num_heads if kv_heads is None else check_int(who, "kv_heads", kv_heads, 1)
        if dim % num_heads or num_heads % self.kv_heads:
            raise ShapeError(f"{who}: dim must be a multiple of num_heads and num_heads of kv_heads; got dim={dim}, "
                             f"num_heads={num_heads}, kv_heads={self.kv_heads}")
        self.compress_block, self.compress_stride = (check_int(who, "compress_block", compress_block, 1),
                                                     check_int(who, "compress_stride", compress_stride, 1))
        self.select_block, self.num_selected = (check_int(who, "select_block", select_block, 1),
                                                check_int(who, "num_selected", num_selected, 1))
        self.window = check_int(who, "window", window, 1)
        if compress_block % compress_stride or select_block % compress_stride:
            raise ArgumentError(f"{who}: compress_block and select_block must be multiples of compress_stride; got "
                                f"{compress_block}, {select_block} and {compress_stride}")
        self.head_dim = d = dim // num_heads
        self.q_proj = nn.Linear(dim, dim)
        self.kv_proj = nn.Linear(dim, 6 * self.kv_heads * d)  # keys and values of the three branches
        self.compress_k, self.compress_v = (_Compress(compress_block, compress_stride, d) for _ in range(2))
        self.gate = nn.Linear(dim, 3 * num_heads)
        self.out_proj = nn.Linear(dim, dim)

    def branches(self, x: torch.Tensor):
        """Queries ``(B, H, n, D)``, the branches' keys and values ``(B, H_kv, n, D)`` (compressed ones
        ``(B, H_kv, n_c, D)``) and the selection mask of eq. 11-12."""
        q, compressed, mask, _ = self._selection(x)
        return q, compressed, self._keys(x, 1), self._keys(x, 2), mask

    def _keys(self, x: torch.Tensor, branch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``(B, H_kv, n, D)`` of branch ``0, 1, 2`` (cmp before phi, slc, win): row blocks
        ``2 branch, 2 branch + 1`` of ``kv_proj``, each its own product and contiguous copy. The attention paths keep
        their inputs for the backward (views of one product would keep all six), and each branch's gradient goes
        through its own product when ready (one product would wait for all six and stack them)."""
        batch, n, _ = x.shape
        hkv, d = self.kv_heads, self.head_dim
        e, w, b = hkv * d, self.kv_proj.weight, self.kv_proj.bias
        k, v = (F.linear(x, w[i * e:(i + 1) * e], b[i * e:(i + 1) * e]).view(batch, n, hkv, d).transpose(1, 2)
                .contiguous() for i in (2 * branch, 2 * branch + 1))
        return k, v

    def _compressed_keys(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """eq. 7: the compressed keys and values ``(B, H_kv, n_c, D)``."""
        k_cmp, v_cmp = self._keys(x, 0)
        return self.compress_k(k_cmp), self.compress_v(v_cmp)

    def _selection(self, x: torch.Tensor, branch: bool = False):
        """Queries, the compressed keys and values, the selection mask (eq. 7-12) and a call giving the compressed
        branch's output (``branch``: computed with the selection where :func:`_one_pass` allows)."""
        batch, n, _ = x.shape
        h, hkv, d = self.num_heads, self.kv_heads, self.head_dim
        q = self.q_proj(x).view(batch, n, h, d).transpose(1, 2).contiguous()  # one copy the three branches share
        if torch.is_grad_enabled() and n >= self.compress_block:
            # recomputed in the backward from x (which the projections keep anyway): phi's convolution would keep its
            # two (B, H_kv, n, D) inputs through the whole backward, the largest saved state of the compressed branch
            params = (self.kv_proj.weight, self.kv_proj.bias, *self.compress_k.parameters(),
                      *self.compress_v.parameters())
            k_c, v_c = _Recomputed.apply(self._compressed_keys, x, *params)
        else:
            k_c, v_c = self._compressed_keys(x)
        scale, shape = 1 / math.sqrt(d), dict(length=self.compress_block, stride=self.compress_stride)
        if branch and _one_pass(q, k_c) and not is_recording():  # one softmax: the compressed branch and the
            # selection (eq. 8); a recorded run calls attention() for the branch, so that its weights are recorded
            o_cmp, lse, chosen = compressed_and_blocks(q, k_c, v_c, block=self.select_block, count=self.num_selected,
                                                       scale=scale, **shape)

            def compressed():
                if torch.is_grad_enabled() and (q.requires_grad or k_c.requires_grad or v_c.requires_grad):
                    return _CompressedBranch.apply(q, k_c, v_c, o_cmp, lse, self.compress_block, self.compress_stride,
                                                   scale)
                return o_cmp
        else:
            chosen = nsa_blocks(q, k_c, block=self.select_block, count=self.num_selected, scale=scale, **shape)

            def compressed():
                return compressed_attention(q, k_c, v_c, **shape)
        chosen_blocks = SelectedKeys(chosen, self.select_block, group_size=h // hkv, distinct=True)  # a top-k
        return q, (k_c, v_c), chosen_blocks & masks.causal(), compressed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_sequence(type(self).__name__, "x", x, self.dim, named=True, like=self)
        batch, n, _ = x.shape
        h = self.num_heads
        g = torch.sigmoid(self.gate(x)).view(batch, n, h, 3).permute(3, 0, 2, 1).unsqueeze(-1)  # (3, B, H, n, 1)
        q, _, mask, compressed = self._selection(x, branch=True)
        # autograd runs the latest recorded operation first: the selected branch (the largest backward) is recorded
        # before the other two, whose backward then frees their saved tensors, and the window's projection its
        # gradients, before the selected branch's backward runs; each branch is gated as soon as it is computed,
        # so only one branch's output gradient is alive at a time
        out = _gated(g[1], attention(q, *self._keys(x, 1), mask=mask))
        out = out + _gated(g[0], compressed())
        out = out + _gated(g[2], attention(q, *self._keys(x, 2), mask=masks.sliding_window(self.window - 1, 0)))
        return self.out_proj(out.transpose(1, 2).reshape(batch, n, self.dim))  # out (B, H, n, D)

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, num_heads={self.num_heads}, kv_heads={self.kv_heads}, compress_block="
                f"{self.compress_block}, compress_stride={self.compress_stride}, select_block={self.select_block}, "
                f"num_selected={self.num_selected}, window={self.window}")


_OPTIONS = ("kv_heads", "compress_block", "compress_stride", "select_block", "num_selected", "window")


def _example():
    g = torch.Generator().manual_seed(0)
    layer = NativeSparseAttention(16, 4, kv_heads=2, compress_block=4, compress_stride=2, select_block=4,
                                  num_selected=3, window=5)
    return layer, (torch.randn(2, 21, 16, generator=g),)


def _count(t, s, module):
    b, n, dim, h, hkv = s["batch"], s["length"], s["dim"], s["heads"], s["kv_heads"]
    d, l, stride = dim // h, s["compress_block"], s["compress_stride"]
    blocks_c = (n - l) // stride + 1 if n >= l else 0
    dt = dtype_of(s)
    t.mm("projections (q, out)", 2, b * n, dim, dim)
    t.mm("projections (keys and values of the selected and window branches)", 1, b * n, dim, 4 * hkv * d)
    # the compressed branch's keys and values and phi: recomputed from x in the backward (_Recomputed); with no
    # block, no gradient
    t.mm("projections (keys and values of the compressed branch)", 1, b * n, dim, 2 * hkv * d,
         recompute=bool(blocks_c), grads=2 if blocks_c else 0)
    t.mm("gates", 1, b * n, dim, 3 * h)
    if blocks_c:
        t.mm("compression phi (keys, values)", 2, b * hkv * blocks_c, l * d, d, recompute=True)
    t.mm("selection importance q K_cmp^T (the compressed branch's scores too)", b * h, n, d, blocks_c, grads=0)
    if blocks_c:  # compressed_and_blocks: p_cmp V_cmp from the selection's softmax; the backward by hand over the
        # rows that see a block, by chunks (_compressed_grads): scores recomputed, then dV, dP, dQ, dK
        t.mm("compressed: p_cmp V_cmp", b * h, n, blocks_c, d, grads=0)
        t.fused("compressed: backward (scores recomputed; dV, dP, dQ, dK)", 0,
                5 * 2 * b * h * (n - l + 1) * blocks_c * d)
        t.inter(b * h * n * (d + 1))
    with torch.no_grad():  # the blocks the module selects on the spec's inputs decide the gathered path's work
        mask = module.branches(_inputs(s, module)[1][0])[-1]
    attend(t, "selected: ", b, h, n, n, d, d, hkv=hkv, dtype=dt, mask=mask)
    attend(t, "window: ", b, h, n, n, d, d, hkv=hkv, dtype=dt, mask=masks.sliding_window(s["window"] - 1, 0))
    t.io(b * n * dim, 0, b * n * dim)


def _make(s):
    with torch.random.fork_rng(devices=[]):  # seeded: the count reads the blocks this module selects
        torch.manual_seed(0)
        return NativeSparseAttention(s["dim"], s["heads"], **{k: s[k] for k in _OPTIONS}).to(dtype_of(s))


def _inputs(s, module):
    return module, (randn(s["batch"], s["length"], s["dim"], dtype=dtype_of(s)),)


register(Entry("native-sparse-attention", NativeSparseAttention,
               "Yuan et al. 2025, arXiv:2502.11089, eq. 5-12 (Native Sparse Attention)", "O(L (L/d + n l' + w) D)",
               "gated compressed, top-n selected and sliding-window branches", "long-sequence", _example,
               spec=Spec({"batch": 2, "length": 21, "dim": 16, "heads": 4, "dtype": "float32", "kv_heads": 2,
                          "compress_block": 4, "compress_stride": 2, "select_block": 4, "num_selected": 3,
                          "window": 5}, _count,
                         _inputs,
                         "projections 2 B n dim (2 dim + 6 H_kv D + 3 H); phi 4 B H_kv n_c l D^2; three attentions",
                         make=_make, module_type=NativeSparseAttention, reads_module=True,
                         config=lambda m: {"dim": m.dim, "heads": m.num_heads, **{k: getattr(m, k) for k in _OPTIONS}},
                         at_scale={"compress_block": 32, "compress_stride": 16, "select_block": 64,
                                   "num_selected": 16, "window": 512},
                         source="Yuan et al. 2025, arXiv:2502.11089, Sec. 4.1: l = 32, d = 16, l' = 64, n = 16, "
                                "w = 512")))
