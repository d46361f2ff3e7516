"""Path ``paged-split-kv``: attention over a paged KV cache, pages read through the page table.

``attention(q, k_pages, v_pages, block_table=..., seqused_k=...)`` (and
:func:`attnkit.varlen_attn` with a block table) hand the dispatcher a pool of pages
``(num_pages, page_size, H_kv, D)`` seen as one key axis, with a
:class:`~attnkit.masks.selected.Pages` mask: sequence ``b`` holds
``seqused_k[b]`` keys on the pages ``block_table[b]``. This path reads only those pages:
split-KV over chunks of :data:`~.selected.SPLIT_KEYS` positions of each sequence, each
chunk's keys gathered from its pages into a chunk-sized copy (never the whole cache),
partials merged by log-sum-exp in one stacked step (:mod:`.selected`); causal masks align
bottom-right to each sequence's own length (decoding, chunked prefill). Without autograd
the splits run on torch's fused CPU kernel with the query heads of a key/value head as rows
of one product, the page table read once per call and a whole chunk of pages copied with one
``index_select`` per pool into buffers kept from call to call. Causal or unmasked calls
(:mod:`.page_segments`) cut each sequence's keys where its queries' view changes: a chunk
runs for the sequences holding it whole with no mask, a key mask only where a sequence's
keys end, the last ``Lq`` keys in one causal call, so ragged lengths cost the keys each
sequence holds. Other masks, quantized pools and sequences shorter than their queries take
the chunked route (:func:`.page_chunks.fused_pages`): no mask where every query sees the
whole chunk, a float mask on a chunk a sequence ends in or the mask cuts. Either way the
kernel's answers are checked together (one sync per call) and only a failing split runs by
formula. Quantized pools (``k_scale=``, ``v_scale=``) are gathered as codes and each chunk
alone is dequantized (:mod:`.page_chunks`).

At one thread a decoding step is bound by reading the cache: the contiguous cache is read
once by torch's kernel, the pages are read once by the copy and the copy once (from the
caches) by the kernel, which cannot overlap the copy. The copy is the price of reading pages
with torch's operators (its kernel reads a key axis of one stride). A decoding step whose
sequences would take as many chunks as there are sequences runs one call per sequence: no
split, no merge, and each sequence reads exactly its own length, on the pool itself where the
sequence's pages are consecutive (a view; :class:`attnkit.nn.PagedKVCache` keeps them so
while the pool allows), else on a copy of its pages (at most
:data:`.page_segments.SEQUENCE_BYTES`); sequences of one length whose pages lie so, equally
spaced, run in one call on a view of the pool.

Decoding steps and chunked prefill that this route serves as it is (causal or unmasked softmax, full
precision, no autograd) skip validation and the decision too: :func:`lane`, called by
:func:`attnkit.attention` for every call with ``seqused_k=``, decides from attributes, reads the
lengths and the table's extremes once, and runs :func:`.page_segments.segments` with the split
the path would take, so it gives the path's bits; anything else, including every input it cannot
vouch for, goes to the full route, which raises attnkit's errors.

The dense paths compute the same function over the whole pool (the mask rejects other
sequences' pages), so they stay exact oracles, but read every page for every sequence:
``backend="auto"`` takes this path for every paged call (``sparse_below`` above 1).
"""

from __future__ import annotations

import math

import torch

from .. import recording
from ..functional.validate import Problem
from . import page_segments, rules, selected

__all__ = ["REFUSALS", "refusal", "run", "cost", "density", "describe", "lane"]

_FLOATS, _INTS = (torch.float32, torch.float64), (torch.int32, torch.int64)


REFUSALS = (rules.paged_cache, rules.not_compiling, rules.no_weights)
# The pages are gathered through the table up to each sequence's length: lanes no query may read are never read,
# so the dispatcher does not zero them (a copy of the pool per sequence) when the pool holds NaN or inf.
READS_ONLY_ALLOWED_KEYS = True


def refusal(p: Problem) -> str | None:
    return rules.first_refusal(p, REFUSALS)


def run(p: Problem):
    return selected.run(p)


def cost(p: Problem, grad: bool = False):
    return selected.cost(p, grad)


def density(p: Problem) -> float:
    """The share of the pool's keys one sequence reads (its pages), from the sizes."""
    return selected.density(p)


def describe(p: Problem) -> str:
    pl = selected.plan(p)
    if not selected.fused_ok(p, pl):
        how = "each gathered alone, "
    elif page_segments.applies(p):
        how = ("torch's fused kernel with the heads of a group as rows: each sequence's chunks it holds whole with no "
               "mask, a key mask where its keys end, its last Lq keys in one causal call, ")
    else:
        how = ("torch's fused kernel with the heads of a group as rows (a mask only on chunks a sequence ends in or "
               "the mask cuts), ")
    return (f"the sequences' pages read through the page table: split-KV over chunks of {pl.keys} positions, "
            f"{how}merged by log-sum-exp in one step")


def lane(q, k, v, mask, score, scale, normalize, dropout_p, return_weights, return_lse, backend, block_table,
         seqused_k) -> torch.Tensor | None:
    """The output of a paged (``block_table``) or contiguous (``(B, H_kv, Lk, D)``) cache call with ``seqused_k``
    that the segment route serves, computed as this path computes it (:func:`.page_segments.segments`, the
    split of :func:`.selected.plan`); None for any other call, any input outside the checked bounds, or an answer
    of torch's kernel the route does not trust: the full route then validates and runs it. Attribute checks,
    then one read of the lengths and one of the table's extremes (a small table read as Python ints, which the segment
    route reuses; the pages in use must lie in the pool: a table
    padded with out-of-range entries past the lengths goes to the full route, which reads only the used ones)."""
    if (backend != "auto" or dropout_p or return_weights or return_lse or normalize != "softmax"
            or score not in ("scaled_dot", "dot") or rules.FLASH is None or recording.listening):
        return None
    if mask is None:
        causal = False
    elif getattr(mask, "kind", None) == "causal" and getattr(mask, "align", None) == "bottom_right":
        causal = True
    else:
        return None
    paged = block_table is not None
    if (type(q) is not torch.Tensor or type(k) is not torch.Tensor or type(v) is not torch.Tensor
            or type(seqused_k) is not torch.Tensor or (paged and type(block_table) is not torch.Tensor)):
        return None
    if not (q.is_cpu and k.is_cpu and v.is_cpu and seqused_k.is_cpu and (not paged or block_table.is_cpu)):
        return None
    dtype = q.dtype
    if (q.ndim != 4 or k.ndim != 4 or v.shape != k.shape or dtype not in _FLOATS or k.dtype != dtype
            or v.dtype != dtype or seqused_k.ndim != 1 or seqused_k.dtype not in _INTS):
        return None
    batch, heads, lq, d = q.shape
    if paged:  # a pool (P, page_size, H_kv, D) and its table (B, n)
        pages, ps, hkv, dk = k.shape
        if block_table.ndim != 2 or block_table.dtype not in _INTS or block_table.shape[0] != batch:
            return None
        width = block_table.shape[1]
    else:  # a cache (B, H_kv, Lk, D): one page per sequence, the whole row (as validation reads it)
        if k.shape[0] != batch:
            return None
        _, hkv, lk, dk = k.shape
        width, ps = 1, max(lk, 1)
    if dk != d or seqused_k.shape[0] != batch or not (batch and lq and d and hkv and width and ps) or heads % hkv:
        return None
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return None
    if scale is None:
        scale = 1.0 / math.sqrt(d) if score == "scaled_dot" else 1.0
    elif type(scale) not in (float, int) or not math.isfinite(scale):
        return None
    if torch.compiler.is_compiling() or torch.is_autocast_enabled("cpu"):
        return None
    step = min(width * ps, selected.SPLIT_KEYS)  # selected.plan's split and rows for these sizes
    if selected.BUDGET // (batch * heads * step) < lq:  # the queries would be cut into chunks of rows
        return None
    lengths = seqused_k.tolist()
    if min(lengths) < lq or max(lengths) > (width * ps if paged else k.shape[2]):
        return None
    table = rows = None
    if paged:
        if block_table.numel() <= page_segments.LISTED_PAGES:  # as Python ints, once (the segments reuse them)
            rows = block_table.tolist()
            low, high = min(map(min, rows)), max(map(max, rows))
        else:
            low, high = (int(end) for end in torch.aminmax(block_table))
        if low < 0 or high >= pages:
            return None
        table = block_table if block_table.dtype == torch.int64 else block_table.long()
    merged = page_segments.segments(q.contiguous(), k, v, table, ps, causal, float(scale), 0, lq, step, lengths,
                                     want_lse=False, table_rows=rows)
    return None if merged is None else merged[0].reshape(batch, heads, lq, d)
