"""A decoding step over selected keys: the selected values read in place, or the rows copied for torch's kernel.

DSA's top-k keys (DeepSeek-AI 2025, arXiv:2512.02556, eq. 2) or NSA's selected blocks (Yuan et al. 2025,
arXiv:2502.11089, eq. 12) when one selection serves every query of the call (``indices`` ``(B|1, Hs|1, 1, n)``:
a decoding step, or a chunk whose queries share their keys), without autograd. The query heads of compute
head ``x`` (its index head and its key/value head) read the keys ``S_x = {i * bs + j : i in indices, j < bs}``::

    out = softmax(q K[S_x]^T * scale) V[S_x]

The keys and values are seen as rows ``(R, E)`` in place (any layout whose batch, head and position strides
are whole rows: contiguous, a slice of a preallocated cache, token-major); nothing proportional to ``Lk`` is
touched, and the selection is not split into chunks merged afterwards. Two routes:

- **values in place** (inputs in the compute dtype, float32 or float64, at most :data:`WEIGHTED_ROWS` query rows
  per compute head): the selected key rows copied once (``index_select``, into this thread's buffer) and scored by
  one ``bmm``, their softmax taken on ``B hx m N`` entries, and the output one ``embedding_bag`` over the selected
  value rows of the cache itself, weighted by the probabilities: the values are never copied (on a cache that no
  longer fits the CPU's caches the step is bound by reading the selected rows from memory, and a copy writes, and
  first reads, as many bytes again);
- **fused** (half precision, more query rows, values with no rows view): the selected rows copied with one
  ``index_select`` each (``B hx n bs (D + Dv)`` elements) into this thread's buffers, kept from step to step
  (:func:`.page_chunks.workspace`, up to :data:`HELD` elements each: buffers of a few MB made afresh by every step
  are returned to the OS and page-faulted in again by the next), then one call of torch's fused CPU kernel.

Slots that name no key (``-1``, past ``Lk``) and keys the mask beside the selection hides are masked with ``-inf``
(on the fused route their rows are zeroed; with the values in place they weigh exactly 0). Each answer is checked:
a NaN or inf (on the fused route also a row torch zeroed, an lse of exactly 0) sends the call to the exact
gathered path (:mod:`.selected`), which answers by attnkit's contract.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from .. import recording
from ..functional.validate import Problem
from ..masks.selected import SelectedKeys, selection_of
from . import rules
from .lane import trusted
from .page_chunks import workspace
from .path_cost import PathCost, Product, fused_attention, itemsize

__all__ = ["applies", "run", "lane", "describe", "cost", "gather", "gather_rows", "BUDGET", "HELD", "WEIGHTED_ROWS"]

BUDGET = 1 << 25  # gathered elements (keys and values) at most: past it the generic path splits the selection
WEIGHTED_ROWS = 8  # query rows per compute head read in place at most (_weighted): at 16 the fused route was as fast
HELD = 1 << 22  # gathered elements of the keys (or values) at most kept in this thread's buffer between steps
_NEG_INF = float("-inf")


def _compute_heads(hs: int, hkv: int) -> int:
    """``hx``: the heads that gather their own keys, for ``hs`` index heads and ``hkv`` key/value heads (as
    :func:`.selected.plan`): each key/value head's, or each index head's where there are more of those."""
    return max(hs, hkv) if hs > 1 else hkv


def _heads(p: Problem) -> tuple[int, torch.Tensor, torch.Tensor]:
    """``(hx, index head, key/value head)`` of each compute head (as :func:`.selected.plan`)."""
    sel, hq = selection_of(p.mask), p.sizes[1]
    hx = _compute_heads(sel.indices.shape[1], p.k.shape[1])
    first = torch.arange(hx, device=p.q.device) * (hq // hx)  # the first query head of each compute head
    return hx, sel.index_head(first), first // p.groups


def applies(p: Problem) -> bool:
    """One selection for every query, of at least one slot, no autograd, softmax of dot products with nothing else,
    on the CPU with ``Dv == D`` (:func:`.rules.cpu_flash`: the fused route's kernel); not pages
    (:mod:`.page_segments`), not traced (the output is checked), within :data:`BUDGET`. (No slot: torch's kernel
    over zero keys raises SIGFPE; the gathered path answers row 1.)"""
    sel = selection_of(p.mask)
    if (sel.lengths is not None or sel.indices.shape[2] != 1 or sel.indices.shape[3] == 0 or p.needs_grad
            or p.tracing or not rules.cpu_flash(p) or p.dropout_p != 0 or p.bias is not None
            or p.modifier is not None or p.sinks is not None
            or p.quant is not None or p.return_weights or p.normalize != "softmax"
            or p.score not in ("dot", "scaled_dot")):
        return False
    hx = _compute_heads(sel.indices.shape[1], p.k.shape[1])
    return p.sizes[0] * hx * sel.indices.shape[3] * sel.block_size * (p.sizes[4] + p.sizes[5]) <= BUDGET


def describe(p: Problem) -> str:
    sel = selection_of(p.mask)
    n = sel.indices.shape[3] * sel.block_size
    if _weighted_ok(p, p.sizes[1] // _heads(p)[0]):
        return (f"a decoding step: the {n} selected keys of each head group copied once, their values read in place, "
                f"weighted (embedding_bag over the selected rows); O(Lq k (D + Dv)), nothing of size Lk (one index "
                f"head of single keys: attnkit.attention takes it after attribute checks only, selected_decode.lane)")
    return (f"a decoding step: the {n} selected keys of each head group copied once (index_select of rows), "
            f"torch's fused kernel over them")


def cost(p: Problem) -> PathCost:
    """``B Hq Lq N`` scores, computed by products over the selected rows (the fused kernel where it runs); the scores
    and row indices, or the gathered keys and values, as workspace."""
    batch, hq, lq, _, d, dv = p.sizes
    sel = selection_of(p.mask)
    slots, hx = sel.indices.shape[3] * sel.block_size, _heads(p)[0]
    scores = batch * hq * lq * slots
    if _weighted_ok(p, hq // hx):
        products = (Product("scores (q k^T at the selected rows)", batch * hx, hq // hx * lq, d, slots, "scores"),
                    Product("weights @ v (the selected rows, in place)", batch * hx, hq // hx * lq, slots, dv,
                            "output"))
        keys = batch * hx * slots * d * itemsize(p)  # the copied keys; the scores, weights and row indices besides
        return PathCost(scores, float(keys + scores * 2 * itemsize(p) + batch * hx * slots * 8 * 2), products,
                        materialized=True)
    return PathCost(scores, float(batch * hx * slots * (d + dv) * itemsize(p)),
                    fused=fused_attention("attention (selected keys gathered once, fused kernel)", scores, d, dv),
                    materialized=False)


def _rows(t: torch.Tensor) -> tuple[torch.Tensor, int, int, int] | None:
    """``t`` ``(B, H, L, E)`` as rows ``(R, E)`` in place, and its batch, head and position strides in rows (None:
    its layout has no such view). Any layout whose strides are whole rows has one: contiguous, a slice of a
    preallocated cache, token-major ``(B, L, H, E)`` seen as ``(B, H, L, E)`` (a projection split into heads)."""
    e = t.shape[-1]
    strides = t.stride()
    if t.numel() == 0 or strides[3] != 1 or any(s % e or s < 0 for s in strides[:3]):
        return None
    sb, sh, sl = (s // e for s in strides[:3])
    b, h, n, _ = t.shape
    count = (b - 1) * sb + (h - 1) * sh + (n - 1) * sl + 1
    return t.as_strided((count, e), (e, 1), t.storage_offset()), sb, sh, sl


def gather(k: torch.Tensor, v: torch.Tensor, b: torch.Tensor, kvh: torch.Tensor,
           tok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows ``k[b, kvh, tok]`` and ``v[b, kvh, tok]`` ``(B, hx, N, E)`` (``b`` ``(B, 1, 1)``, ``kvh`` ``(hx,)``,
    ``tok`` ``(B, hx, N)``), each copied by :func:`gather_rows`."""
    return gather_rows(k, b, kvh, tok, "decode keys"), gather_rows(v, b, kvh, tok, "decode values")


def gather_rows(t: torch.Tensor, b: torch.Tensor, kvh: torch.Tensor, tok: torch.Tensor, name: str) -> torch.Tensor:
    """The rows ``t[b, kvh, tok]`` ``(B, hx, N, E)``: one ``index_select`` of rows (advanced indexing where the layout
    has no row view), into this thread's buffer ``name`` when at most :data:`HELD` elements (valid until the next
    step)."""
    rows = _rows(t)
    if rows is None:
        return t[b, kvh.view(1, -1, 1), tok]
    where = _row_index(kvh, tok, *rows[1:]).view(-1)  # (B hx N)
    gathered = torch.index_select(rows[0], 0, where, out=_buffer(t, where.numel(), t.shape[-1], name))
    return gathered.view(*tok.shape, t.shape[-1])


def _weighted_ok(p: Problem, gp: int) -> bool:
    """The values can be read in place, weighted (:func:`_weighted`): keys and values in the compute dtype (no cast),
    the values' rows a view (:func:`_rows`), at most :data:`WEIGHTED_ROWS` query rows per compute head."""
    dt = p.compute_dtype
    return (p.k.dtype == dt and p.v.dtype == dt and p.q.dtype == dt and gp * p.sizes[2] <= WEIGHTED_ROWS
            and _rows(p.v) is not None)


def _weighted(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, want_lse: bool, hx: int,
              kv_heads: torch.Tensor, tok: torch.Tensor, allowed: torch.Tensor | None):
    """``(out, lse)`` ``(B, Hq, Lq, Dv)``, ``(B, Hq, Lq)`` (None unless ``want_lse``), or None when not finite (the
    caller runs the exact path); ``q, k, v`` in one floating dtype, ``v`` with a rows view (:func:`_rows`).

    The ``m = gp Lq`` query rows of each compute head score its selected keys, copied once (one ``index_select``
    into this thread's buffer, then one ``bmm`` with the queries on the left: ``(m, D) @ (D, N)`` per compute head;
    the keys-on-the-left form, ``(N, D) @ (D, m)``, took 8x the time at ``m = 1`` on this CPU's BLAS); their softmax
    is taken, and the values are never copied: ``embedding_bag`` sums each query row's selected value rows, weighted
    by its probabilities, reading each row of the cache in place once per query row. Slots a query may not read
    (``allowed`` ``(B hx, m, N)`` False) score ``-inf``, so weigh exactly 0 (a NaN or inf stored there makes the
    output non-finite: refused)."""
    batch, hq, lq, d = q.shape
    dv = v.shape[-1]
    m, n = hq // hx * lq, tok.shape[-1]
    rows_v, rows_k = _rows(v), _rows(k)
    assert rows_v is not None  # (_weighted_ok)
    values, layout = rows_v[0], rows_v[1:]
    where = _row_index(kv_heads, tok, *layout)  # (B, hx, N)
    if rows_k is None:  # no rows view: advanced indexing
        b = torch.arange(batch, device=tok.device).view(-1, 1, 1)
        k_g = k[b, kv_heads.view(1, -1, 1), tok]
    else:
        at = where if rows_k[1:] == layout else _row_index(kv_heads, tok, *rows_k[1:])
        k_g = torch.index_select(rows_k[0], 0, at.view(-1), out=_buffer(k, at.numel(), d))
    s = torch.bmm(q.reshape(batch * hx, m, d), k_g.view(batch * hx, n, d).transpose(1, 2)).mul_(scale)
    if allowed is not None:
        s.masked_fill_(~allowed, _NEG_INF)
    weights = torch.softmax(s, -1)
    if allowed is not None:  # rows with no key: softmax over nothing is NaN; they weigh nothing (output 0)
        weights.masked_fill_(~allowed.any(-1, keepdim=True), 0.0)
    bags = where.view(-1) if m == 1 else where.unsqueeze(2).expand(batch, hx, m, n).reshape(-1)
    offsets = _arange(0, bags.numel(), n) if bags.is_cpu else torch.arange(0, bags.numel(), n, device=bags.device)
    out = F.embedding_bag(bags, values, offsets, mode="sum", per_sample_weights=weights.view(-1))
    if not math.isfinite(out.sum().item()):  # a score of NaN or +inf makes its row's weights NaN: caught here too
        return None  # NaN or inf: the exact path answers by attnkit's contract
    lse = torch.logsumexp(s, -1).view(batch, hq, lq) if want_lse else None  # (-inf on rows with no key)
    return out.view(batch, hq, lq, dv), lse


def _row_index(kvh: torch.Tensor, tok: torch.Tensor, sb: int, sh: int, sl: int) -> torch.Tensor:
    """The row of every selected key, ``b sb + kvh[x] sh + tok[b, x, j] sl``, in a rows view of strides ``sb, sh, sl``
    (:func:`_rows`): ``(B, hx, N)`` int64 (``tok`` ``(B, hx, N)``)."""
    where = torch.add((kvh * sh).view(1, -1, 1), tok, alpha=sl)
    if tok.shape[0] > 1:
        where += (torch.arange(tok.shape[0], device=tok.device) * sb).view(-1, 1, 1)  # (sb 0: a cache expanded)
    return where


def _buffer(t: torch.Tensor, rows: int, width: int, name: str = "decode keys") -> torch.Tensor | None:
    """This thread's buffer ``name`` for ``rows`` gathered rows of ``t`` (:func:`.page_chunks.workspace`), or None
    (a fresh tensor) past :data:`HELD` elements."""
    return workspace(t).take(name, rows, width) if rows * width <= HELD else None


def _slots(idx: torch.Tensor, lk: int, batch: int, hx: int,
           bounds: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(tok, valid)`` of the slots ``idx`` ``(B|1, hx|1, N)``: the key each reads ``(B, hx, N)`` (a slot naming no
    key, -1 or past ``Lk``, reads key 0) and which name a key (None: every slot, learnt from one reduction, or from
    ``bounds``, the indices' ``(min, max)`` when known)."""
    low, high = bounds if bounds is not None else (int(end) for end in torch.aminmax(idx))
    if low >= 0 and high < lk:
        return idx.expand(batch, hx, -1), None
    return idx.clamp(0, max(lk - 1, 0)).expand(batch, hx, -1), (idx >= 0) & (idx < lk)


def lane(q, k, v, mask, bias, score, scale, normalize, dropout_p, return_weights, return_lse, backend,
         sinks) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """``(out, lse)`` of a decoding step ``attnkit.attention(q, k, v, mask=masks.selected_keys(idx))`` that this path
    serves with the values in place, computed as :func:`run` computes it (the same function, the same bits), with
    only attribute checks before it: validation, the dispatcher and the path's planning cost more than the step's
    arithmetic on a small selection. One index head ``(B|1, 1, 1, n)`` of single keys, 4-D float32 or float64 CPU
    tensors, no autograd, softmax of dot products with nothing else, at most :data:`WEIGHTED_ROWS` query rows per
    key/value head, ``n < Lk / 2`` (where the dispatcher picks this path: blocksparse-gathered's ``sparse_below``).
    The indices are checked as validation checks them (:meth:`~attnkit.masks.selected.SelectedKeys.check_keys`, the
    same error). None for any other call, or an answer that is not finite: the full route then validates, decides and
    runs it."""
    if (type(mask) is not SelectedKeys or backend != "auto" or bias is not None or sinks is not None or return_weights
            or normalize != "softmax" or score not in ("scaled_dot", "dot") or dropout_p != 0 or recording.listening):
        return None
    if type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor:
        return None
    dtype, idx = q.dtype, mask.indices
    if (dtype not in (torch.float32, torch.float64) or k.dtype != dtype or v.dtype != dtype or q.ndim != 4
            or k.ndim != 4 or v.ndim != 4 or not (q.is_cpu and k.is_cpu and v.is_cpu and idx.is_cpu)):
        return None
    batch, hq, lq, d = q.shape
    _, hkv, lk, _ = k.shape
    n = idx.shape[3]
    if (k.shape[0] != batch or v.shape[:3] != k.shape[:3] or k.shape[3] != d or v.shape[3] != d
            or not (batch and lq and d and hkv) or hq % hkv or mask.block_size != 1 or idx.shape[1] != 1
            or idx.shape[2] != 1 or idx.shape[0] not in (1, batch) or not n or 2 * n >= lk
            or hq // hkv * lq > WEIGHTED_ROWS or batch * hkv * n * 2 * d > BUDGET):
        return None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return None
    if torch.compiler.is_compiling() or torch.is_autocast_enabled("cpu") or _rows(v) is None:
        return None
    if scale is None:
        scale = 1.0 / math.sqrt(d) if score == "scaled_dot" else 1.0  # (validate.default_scale)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        return None
    low, high = (int(end) for end in torch.aminmax(idx))
    if high >= lk:
        mask.check_keys(lk, "attnkit.attention: mask")  # validation's error (an index past the last key)
    tok, valid = _slots(idx[:, :, 0], lk, batch, hkv, (low, high))
    allowed = None if valid is None else valid.expand(batch, hkv, n).reshape(batch * hkv, 1, n)
    return _weighted(q, k, v, float(scale), bool(return_lse), hkv, _arange(0, hkv, 1), tok, allowed)


@functools.lru_cache(maxsize=64)
def _arange(start: int, stop: int, step: int) -> torch.Tensor:
    """``torch.arange(start, stop, step)`` on the CPU, made once (the step's head and bag offsets; never written)."""
    return torch.arange(start, stop, step)


def run(p: Problem):
    """The step's :class:`~.pipeline.KernelOutput`, or None when torch's answer cannot be trusted (the caller runs
    the exact path)."""
    from .pipeline import KernelOutput

    sel = selection_of(p.mask)
    batch, hq, lq, lk, _, _ = p.sizes
    dt, dev = p.compute_dtype, p.q.device
    bs = sel.block_size
    idx = sel.indices.to(dev)
    if idx.shape[1] > 1:
        hx, idx_heads, kv_heads = _heads(p)
        idx = idx.index_select(1, idx_heads)  # (B|1, hx, 1, n)
    else:  # one index head: the compute heads are the key/value heads, in order
        hx = p.k.shape[1]
        kv_heads = torch.arange(hx, device=dev)
    idx = idx[:, :, 0]
    if bs > 1:
        idx = (idx[..., None] * bs + torch.arange(bs, device=dev)).flatten(-2).masked_fill_(
            (idx < 0).repeat_interleave(bs, -1), -1)
    tok, valid = _slots(idx, lk, batch, hx)
    gp = hq // hx
    allowed = None if valid is None else valid[:, :, None, :]  # (B|1, hx|1, 1, N)
    beside = getattr(p.mask, "rest", None)
    if beside is not None:  # the mask beside the selection, at the gathered positions
        b = torch.arange(batch, device=dev).view(-1, 1, 1)
        where = tok[:, :, None, :] if gp == 1 else tok.repeat_interleave(gp, 1)[:, :, None, :]
        rest = beside.allows(b.view(-1, 1, 1, 1), torch.arange(hq, device=dev).view(1, -1, 1, 1),
                                  torch.arange(lq, device=dev).view(1, 1, -1, 1), where, lq, lk)
        if allowed is not None and allowed.shape[1] > 1 and gp > 1:
            allowed = allowed.repeat_interleave(gp, 1)
        allowed = rest if allowed is None else allowed & rest
    if _weighted_ok(p, gp):
        grouped = None
        if allowed is not None:  # per query head, as rows (B hx, gp Lq, N)
            if allowed.shape[1] > 1 and allowed.shape[1] != hq:
                allowed = allowed.repeat_interleave(gp, 1)
            grouped = allowed.expand(batch, hq, lq, allowed.shape[-1]).reshape(batch * hx, gp * lq, -1)
        step = _weighted(p.q, p.k, p.v, p.scale, p.return_lse, hx, kv_heads, tok, grouped)
        return None if step is None else KernelOutput(step[0], None, step[1])
    k_g, v_g = gather(p.k, p.v, torch.arange(batch, device=dev).view(-1, 1, 1), kv_heads, tok)
    k_g, v_g = k_g.to(dt), v_g.to(dt)
    q, flash = p.q.to(dt), rules.FLASH
    assert flash is not None  # (applies: rules.cpu_flash)
    if allowed is None:
        out, lse = flash(q, k_g, v_g, 0.0, False, scale=p.scale)[:2]
        if not trusted(out, lse):
            return None  # NaN, inf or a row torch zeroed (an lse of exactly 0): the exact path
        return KernelOutput(out, None, lse if p.return_lse else None)
    if valid is not None:  # rows of slots that name no key: zeroed (what is stored there never reaches a product)
        zero = ~valid[..., None]
        k_g, v_g = k_g.masked_fill_(zero, 0.0), v_g.masked_fill_(zero, 0.0)
    if allowed.shape[1] > 1 and allowed.shape[1] != hq:  # per compute head: each query head reads its own
        allowed = allowed.repeat_interleave(gp, 1)
    allowed = allowed.expand(batch, allowed.shape[1], lq, allowed.shape[-1])
    float_mask = torch.zeros(allowed.shape, dtype=dt, device=dev).masked_fill_(~allowed, _NEG_INF)
    out, lse = flash(q, k_g, v_g, 0.0, False, attn_mask=float_mask, scale=p.scale)[:2]
    has = allowed.any(-1)  # (B, 1 | Hq, Lq)
    bad = ~torch.isfinite(torch.where(has, out.sum(-1) + lse, 0.0)) | (has & (lse == 0))
    if bool(bad.any()):
        return None  # NaN, inf or a row torch zeroed on a row with keys: the exact path
    out, lse = out.masked_fill(~has[..., None], 0.0), lse.masked_fill(~has, _NEG_INF)
    return KernelOutput(out, None, lse if p.return_lse else None)
