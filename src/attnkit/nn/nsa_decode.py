"""NSA's decoding step: the three branches of one query over its caches, the compressed keys scored once.

Yuan et al. 2025, arXiv:2502.11089, eq. 5-12 for the query ``q_t`` at the last position ``t`` of the caches. The
selection's importance (eq. 8) is the compressed branch's own attention probabilities, so one softmax over the
compressed keys serves both::

    p     = softmax(q_t K_cmp^T * scale)           over the compressed blocks ended by t (eq. 7-8)
    o_cmp = p V_cmp                                the compressed branch, from those probabilities
    S     = top-n blocks of eq. 9-11 from p        (:func:`.nsa._top_blocks`, as the whole sequence's call selects)
    o_slc = Attn(q_t, K_slc[S], V_slc[S])          the selected blocks' keys up to t, copied once, torch's kernel
    o_win = Attn(q_t, K_win[-w:], V_win[-w:])      read in place, torch's kernel

With GQA the ``g`` query heads of a key/value head are rows of one product over its compressed keys, and the
selection is the group's (eq. 10). The selected keys of every head are the same number (its ``min(n, own + 1)``
blocks, the query's own block, always among them, cut at ``t``), so the copy ``(B, H_kv, N, D)`` needs no mask:
the blocks in rank order, the own block first (:func:`.nsa._top_blocks`), ``N = (n_sel - 1) l' + t + 1 - own l'``.

Torch's fused CPU kernel serves the selected and window branches without autograd, in float32 or float64; its
answers are checked as the fast lane checks them (:func:`attnkit.kernels.lane.trusted`) and the compressed branch
for NaN or inf. Anything else (autograd, another device or dtype, a failed check) runs the same step as
``nsa_blocks(start=t)`` and three :func:`attnkit.attention` calls, which answer by attnkit's contract.
"""

from __future__ import annotations

import functools
import math

import torch

from .. import masks
from ..core import attention
from ..errors import ArgumentError, ShapeError, check_int
from ..kernels import rules
from ..kernels.lane import trusted
from ..kernels.page_chunks import workspace
from ..kernels.selected_decode import HELD, _rows, gather
from ..masks.selected import SelectedKeys
from .nsa import _top_blocks, nsa_blocks

__all__ = ["nsa_decode"]

_FAST_DTYPES = (torch.float32, torch.float64)


def nsa_decode(q: torch.Tensor, k_cmp: torch.Tensor, v_cmp: torch.Tensor, k_slc: torch.Tensor, v_slc: torch.Tensor,
               k_win: torch.Tensor, v_win: torch.Tensor, *, length: int, stride: int, block: int, count: int,
               window: int, scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The compressed, selected and window branches ``(o_cmp, o_slc, o_win)``, each ``(B, H, 1, Dv)``, of the query
    at the last position of the caches (what :class:`~attnkit.nn.NativeSparseAttention` gates, eq. 5).

    Args:
        q: the query ``(B, H, 1, D)``.
        k_cmp, v_cmp: the compressed keys and values ``(B, H_kv, n_c, D|Dv)`` (eq. 7; the blocks not yet ended
            by the query, if any, are not read).
        k_slc, v_slc: the selected branch's cache ``(B, H_kv, t + 1, D|Dv)``: the query is at position ``t``.
        k_win, v_win: the window branch's cache ``(B, H_kv, L_w, D|Dv)``; its last ``window`` rows are read (a
            cache of every position, or a rolling one of the last ``window``).
        length, stride: ``l`` and ``d`` of the compression; block: ``l'`` (``l`` and ``l'`` multiples of ``d``, as
            the module's); count: ``n`` blocks selected;
        window: ``w``; scale: default ``D ** -0.5``.
    """
    who = "nsa_decode"
    for name, value in (("length", length), ("stride", stride), ("block", block), ("count", count),
                        ("window", window)):
        check_int(who, name, value, 1)
    if length % stride or block % stride:  # eq. 9 counts whole chunks of `stride` keys (as NativeSparseAttention)
        raise ArgumentError(f"{who}: length and block must be multiples of stride; got length={length}, "
                            f"block={block}, stride={stride}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale)):
        raise ArgumentError(f"{who}: scale must be a finite real number or None; got {scale!r}")
    caches = (k_cmp, v_cmp, k_slc, v_slc, k_win, v_win)
    if q.dim() != 4 or q.shape[2] != 1 or any(t.dim() != 4 for t in caches):
        raise ShapeError(f"{who}: q must be (B, H, 1, D) and the caches (B, H_kv, L, D); got q {tuple(q.shape)}, "
                         f"caches {[tuple(t.shape) for t in caches]}")
    batch, heads, _, d = q.shape
    kv_heads, dv = k_slc.shape[1], v_slc.shape[3]
    if not (heads % kv_heads == 0 and k_slc.shape[2] > 0 and k_win.shape[2] > 0
            and all(t.shape[0] == batch and t.shape[1] == kv_heads for t in caches)
            and k_cmp.shape[3] == k_slc.shape[3] == k_win.shape[3] == d and v_cmp.shape[3] == v_win.shape[3] == dv
            and k_cmp.shape[2] == v_cmp.shape[2] and k_slc.shape[2] == v_slc.shape[2]
            and k_win.shape[2] == v_win.shape[2]):
        raise ShapeError(f"{who}: the caches must share B and H_kv (dividing q's H), the keys q's D, the values one "
                         f"Dv, and hold the query's position; got q {tuple(q.shape)}, caches "
                         f"{[tuple(t.shape) for t in caches]}")
    scale = d ** -0.5 if scale is None else scale
    t = k_slc.shape[2] - 1
    ended = max(0, min(k_cmp.shape[2], (t + 1 - length) // stride + 1))  # compressed blocks i d + l - 1 <= t
    if ended < k_cmp.shape[2]:
        k_cmp, v_cmp = k_cmp.narrow(2, 0, ended), v_cmp.narrow(2, 0, ended)
    if window < k_win.shape[2]:
        k_win, v_win = (c.narrow(2, c.shape[2] - window, window) for c in (k_win, v_win))
    args = (q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win)
    kw = dict(length=length, stride=stride, block=block, count=count, scale=scale)
    fast = (rules.FLASH is not None and q.dtype in _FAST_DTYPES and dv == d
            and all(c.dtype == q.dtype and c.is_cpu for c in args)
            and not (torch.is_grad_enabled() and any(c.requires_grad for c in args))
            and not torch.compiler.is_compiling())
    out = _fused(*args, **kw) if fast else None
    return out if out is not None else _composed(*args, **kw)


def _fused(q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, *, length, stride, block, count, scale):
    """The step on torch's kernel with one softmax over the compressed keys; None when a check fails."""
    with torch.no_grad():
        batch, heads, _, d = q.shape
        kv_heads, ended, t = k_slc.shape[1], k_cmp.shape[2], k_slc.shape[2] - 1
        q_rows = q.reshape(batch, kv_heads, heads // kv_heads, d)  # a group's heads as rows
        scores = (q_rows * scale) @ k_cmp.transpose(-1, -2)  # (B, H_kv, g, n_c): as the whole sequence's selection
        p = torch.softmax(scores, -1)
        o_cmp = (p @ v_cmp).view(batch, heads, 1, -1) if ended else q.new_zeros(batch, heads, 1, v_cmp.shape[-1])
        chosen = _top_blocks(p.unsqueeze(3), t, t, t + 1, length=length, stride=stride, block=block, count=count)
        k_g, v_g = _selected_keys(k_slc, v_slc, chosen[:, :, 0], t, block)
        o_slc, lse_slc = rules.FLASH(q, k_g, v_g, 0.0, False, scale=scale)[:2]
        o_win, lse_win = rules.FLASH(q, k_win, v_win, 0.0, False, scale=scale)[:2]
        out = torch.stack((o_cmp, o_slc, o_win))
        if not trusted(out, torch.cat((lse_slc, lse_win), 1)):
            return None  # NaN, inf or a row torch zeroed: the composed step answers by attnkit's contract
        return out.unbind()


def _selected_keys(k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, t: int,
                   block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values ``(B, H_kv, N, E)`` of the blocks ``idx`` ``(B, H_kv, n_sel)`` (each ``<= own = t // l'``,
    the own block first) up to position ``t``, ``N = (n_sel - 1) l' + t + 1 - own l'``.

    The own block is read as the ``l'`` positions ending at ``t`` (no position past the cache), and its first rows,
    which the block before also holds, are left out of the view. Rows contiguous in position (a contiguous cache, a
    slice of a preallocated one): the blocks copied whole, one ``index_select`` of ``l' E`` elements a block (the
    cache seen as overlapping rows of ``l'`` positions, one starting at every position). Otherwise the rows one by
    one (:func:`.selected_decode.gather`)."""
    batch, kv_heads, n_sel = idx.shape
    own = t // block
    if own == 0:
        return k[:, :, :t + 1], v[:, :, :t + 1]  # one block, the cache itself
    starts = idx.mul(block).clamp_(max=t + 1 - block)  # every other block ends before t + 1 - l'
    cut = (own + 1) * block - t - 1  # the own block's rows the block before holds
    rows_k, rows_v = _rows(k), _rows(v)
    if rows_k is None or rows_v is None or rows_k[1:] != rows_v[1:] or rows_k[3] != 1:
        dev = idx.device
        tok = (starts[..., None] + torch.arange(block, device=dev)).flatten(-2)[..., cut:]
        return gather(k, v, torch.arange(batch, device=dev).view(-1, 1, 1), torch.arange(kv_heads, device=dev), tok)
    where = starts.add_(_first_rows(batch, kv_heads, rows_k[1], rows_k[2])).flatten()  # each block's first row
    out = []
    for flat, name in ((rows_k[0], "decode keys"), (rows_v[0], "decode values")):
        width = block * flat.shape[1]
        blocks = flat.as_strided((flat.shape[0] - block + 1, width), (flat.shape[1], 1))  # a block at every row
        if where.numel() * width > HELD:
            gathered = blocks.index_select(0, where)
        else:
            gathered = torch.index_select(blocks, 0, where, out=workspace(flat).take(name, where.numel(), width))
        out.append(gathered.view(batch, kv_heads, n_sel * block, flat.shape[1])[:, :, cut:])
    return out[0], out[1]


@functools.lru_cache(maxsize=64)
def _first_rows(batch: int, kv_heads: int, sb: int, sh: int) -> torch.Tensor:
    """The row of position 0 of each head ``(B, H_kv, 1)``, as :func:`.selected_decode._rows` counts rows."""
    return torch.tensor([[[i * sb + h * sh] for h in range(kv_heads)] for i in range(batch)])


def _composed(q, k_cmp, v_cmp, k_slc, v_slc, k_win, v_win, *, length, stride, block, count, scale):
    """The step as ``nsa_blocks(start=t)`` and three :func:`attnkit.attention` calls (autograd flows through)."""
    batch, heads, _, _ = q.shape
    kv_heads, t = k_slc.shape[1], k_slc.shape[2] - 1
    chosen = nsa_blocks(q, k_cmp, length=length, stride=stride, block=block, count=count, scale=scale, start=t)
    no_block = q.new_zeros(batch, heads, 1, v_cmp.shape[-1])  # no block ended: 0 (as the module)
    o_cmp = attention(q, k_cmp, v_cmp, scale=scale) if k_cmp.shape[2] else no_block
    selection = SelectedKeys(chosen, block, group_size=heads // kv_heads, distinct=True) & masks.causal()
    o_slc = attention(q, k_slc, v_slc, mask=selection, scale=scale)
    o_win = attention(q, k_win, v_win, scale=scale)
    return o_cmp, o_slc, o_win
