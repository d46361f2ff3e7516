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
with torch's operators.

The dense paths compute the same function over the whole pool (the mask rejects other
sequences' pages), so they stay exact oracles, but read every page for every sequence:
``backend="auto"`` takes this path for every paged call (``sparse_below`` above 1).
"""

from __future__ import annotations

from ..functional.validate import Problem
from . import page_segments, rules, selected

__all__ = ["REFUSALS", "refusal", "run", "cost", "density", "describe"]


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
