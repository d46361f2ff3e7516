"""Packed documents, paged decoding and data-dependent sparse attention against what they replace, in one run.

Rows (1 thread; each row's two sides interleaved by :func:`attnkit.lab.analysis.timing.time_rounds`,
the time ratio taken per round and summarised by its median and range; peak memory of each side
measured once in a fresh process, :mod:`attnkit.lab.analysis.memory`):

- packed: documents of random lengths packed in one row, causal inside each, forward + backward
  through :func:`attnkit.varlen_attn`, against the same documents padded into a batch and run by
  torch's SDPA with the causal-and-padding bool mask (what a padded training batch computes);
- paged: one decoding step (one query per sequence) over a :class:`attnkit.nn.PagedKVCache` whose
  sequences were appended a page at a time, in turn (the cache keeps each sequence's pages consecutive while
  the pool allows, so they are read in place), against the same keys in a contiguous cache
  (``attnkit.attention(q, k, v, mask=causal())``, torch's kernel); target <= 1.10x;
- paged-prefill: the same with 16 queries per sequence (chunked prefill, causal); target <= 1.15x;
- paged-scattered: the decoding step with the pool's pages shuffled (the table follows them), so that no two
  pages of a sequence are neighbours: every page copied before torch's kernel reads it (no target; what a
  fragmented pool costs);
- NSA, MoBA and DSA: :class:`attnkit.nn.NativeSparseAttention`, :class:`attnkit.nn.MoBA` and
  :class:`attnkit.nn.DSASparseAttention` (top-k ``L / 8``: 2048 of 16384 keys) against dense causal
  attention with the same projections (:class:`attnkit.models.SoftmaxSelfAttention`) at ``L = 4096``
  and ``16384``, forward + backward (different functions: only time and memory); targets at 16384:
  NSA, MoBA <= 0.5x time and peak <= 1.5x dense's, DSA <= 0.4x; at 4096 NSA, MoBA <= 1.0x (DSA's
  module time includes its indexer, ``O(L^2 H_I d_I)`` and a top-k per query);
- dsa-attention: DSA's sparse attention alone, each query's top ``L / 8`` keys (a fixed random causal
  top-k) through ``attnkit.attention(q, k, v, mask=selected_keys(idx) & causal())``, against dense causal
  attention on the same ``q, k, v`` (``B = 1, H = 4, D = 64``: the modules' shapes), forward + backward;
  target at 16384 (top-k 2048): <= 0.4x;
- decode: one decoding step (one query, no autograd) over caches of 16384 tokens: NSA's three branches
  (:func:`attnkit.nn.nsa_decode.nsa_decode`: one softmax over the cached compressed keys gives the compressed
  branch and the selection, then the selected blocks' and the window's attentions) and DSA's
  attention over its indexer's top 2048 keys (the indexer's scores over its cached keys and the top-k included;
  ``attention(q, k, v, mask=selected_keys(idx))`` takes the selected-keys decode lane: the key rows copied once, the
  values read in place) against dense attention over the whole cache; target <= 0.5x.

Usage: ``python benchmarks/sparse_and_packed.py [--rounds 5] [--write BENCHMARKS.md]``;
``--smoke`` runs every row at tiny sizes (a check that the script works, not a measurement);
``--only paged`` runs only the rows whose name starts so (here paged, paged-prefill and paged-scattered;
printed, never written, since the section holds every row).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import attnkit
from attnkit import masks
from attnkit.lab.analysis.memory import peak_bytes, reset_peak
from attnkit.lab.analysis.timing import time_rounds
from attnkit.lab.benchmarking.child import child_output, run_as_child
from attnkit.lab.benchmarking.sections import emit
from attnkit.models.self_attention import SoftmaxSelfAttention
from attnkit.nn import DSASparseAttention, MoBA, NativeSparseAttention, PagedKVCache
from attnkit.nn.nsa_decode import nsa_decode

NAME, TITLE = "sparse-and-packed", "Packed documents, paged decoding, NSA, MoBA and DSA"
FULL = {"packed": dict(docs=16, shortest=64, longest=1024, heads=8, head_dim=64),
        "paged": dict(batch=4, length=4096, heads=8, kv_heads=2, head_dim=64, page_size=16),
        "sparse": dict(lengths=(4096, 16384), dim=256, heads=4)}
SMOKE = {"packed": dict(docs=3, shortest=5, longest=40, heads=2, head_dim=8),
         "paged": dict(batch=2, length=50, heads=4, kv_heads=2, head_dim=8, page_size=4),
         "sparse": dict(lengths=(96,), dim=16, heads=2)}


def _lengths(s, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(s["shortest"], s["longest"] + 1, (s["docs"],), generator=g)


def packed_sides(s):
    """``(ours, theirs)``: each a call computing the documents' attention forward and backward, returning dq."""
    lengths = _lengths(s)
    cu = F.pad(torch.cumsum(lengths, 0), (1, 0)).to(torch.int32)
    total, longest, h, d = int(cu[-1]), int(lengths.max()), s["heads"], s["head_dim"]
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(total, h, d, generator=g) for _ in range(3))
    doc = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    slot = torch.arange(total) - (cu[:-1].long())[doc]  # each token's position in its document
    keep = torch.arange(longest)[None] < lengths[:, None]  # (N, longest)
    allowed = keep[:, None, None, :] & torch.ones(longest, longest, dtype=torch.bool).tril()  # causal and padding

    def ours():
        qq = q.clone().requires_grad_()
        attnkit.varlen_attn(qq, k, v, cu, cu, longest, longest, window_size=(-1, 0)).sum().backward()
        return qq.grad

    def theirs():
        def pad(t):
            out = t.new_zeros(len(lengths), longest, h, d)
            out[doc, slot] = t
            return out.transpose(1, 2)  # (N, H, longest, D)
        qq = q.clone().requires_grad_()
        out = F.scaled_dot_product_attention(pad(qq), pad(k), pad(v), attn_mask=allowed)
        out.transpose(1, 2)[doc, slot].sum().backward()  # the real tokens' outputs
        return qq.grad
    return ours, theirs


def paged_sides(s, q_len: int = 1, scattered: bool = False):
    """``(ours, theirs)``: one decoding step (or a chunked prefill of ``q_len`` queries) over a paged cache (its
    pages shuffled when ``scattered``) and over a contiguous one."""
    b, n, h, hkv, d, ps = (s[k] for k in ("batch", "length", "heads", "kv_heads", "head_dim", "page_size"))
    g = torch.Generator().manual_seed(2)
    keys, values = torch.randn(b, hkv, n, d, generator=g), torch.randn(b, hkv, n, d, generator=g)
    cache = PagedKVCache(b * -(-n // ps), ps, hkv, d)
    seqs = [cache.allocate() for _ in range(b)]
    for start in range(0, n, ps):  # a page at a time, in turn
        for i, seq in enumerate(seqs):
            cache.append(seq, keys[i, :, start:start + ps], values[i, :, start:start + ps])
    table, used = cache.block_table(seqs), cache.lengths(seqs)
    if scattered:  # pool page `place[p]` holds page p: no two pages of a sequence neighbours
        place = torch.randperm(cache.k_pages.shape[0], generator=g)
        for pool in (cache.k_pages, cache.v_pages):
            pool[place] = pool.clone()
        table = place[table]
    q = torch.randn(b, h, q_len, d, generator=g)
    causal = masks.causal()

    def ours():
        return attnkit.attention(q, cache.k_pages, cache.v_pages, block_table=table, seqused_k=used, mask=causal)

    def theirs():
        return attnkit.attention(q, keys, values, mask=causal)
    return ours, theirs


def sparse_sides(s, length):
    """``{name: call}``: NSA, MoBA, DSA and dense causal attention at ``length``, forward + backward."""
    dim, heads = s["dim"], s["heads"]
    block = 64 if length >= 1024 else 8
    torch.manual_seed(0)
    layers = {"dense": SoftmaxSelfAttention(dim, heads, causal=True),
              "NSA": NativeSparseAttention(dim, heads, compress_block=block // 2, compress_stride=block // 4,
                                           select_block=block, num_selected=16, window=8 * block),
              "MoBA": MoBA(dim, heads, block_size=8 * block, top_k=3)}
    layers["DSA"] = DSASparseAttention(dim, heads, top_k=length // 8, index_heads=4, index_dim=32)
    x = torch.randn(1, length, dim, generator=torch.Generator().manual_seed(3))

    def call(layer):
        def run():
            layer.zero_grad(set_to_none=True)
            layer(x).sum().backward()
        return run
    return {name: call(layer) for name, layer in layers.items()}


def dsa_attention_sides(s, length):
    """``(ours, theirs)``: attention over each query's top ``length / 8`` keys (random scores' causal top-k) and dense
    causal attention, on the same ``q, k, v``, forward + backward, returning dq."""
    heads, d, top = s["heads"], s["dim"] // s["heads"], max(1, length // 8)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, heads, length, d, generator=g) for _ in range(3))
    rows = []
    for r0 in range(0, length, 512):  # a chunk of queries at a time: no length x length scores
        t = torch.arange(r0, min(length, r0 + 512)).view(-1, 1)
        scores = torch.rand(len(t), length, generator=g).masked_fill(torch.arange(length) > t, -1.0)
        values, idx = scores.topk(min(top, length), -1)
        rows.append(idx.masked_fill(values < 0, -1))
    mask = masks.selected_keys(torch.cat(rows)) & masks.causal()
    causal = masks.causal()

    def side(m):
        def run():
            qq = q.clone().requires_grad_()
            attnkit.attention(qq, k, v, mask=m).sum().backward()
            return qq.grad
        return run
    return side(mask), side(causal)


def decode_sides(s, length):
    """``{name: call}``: one decoding step (one query, the last position) over caches of ``length`` tokens, no
    autograd: NSA's three branches (its selection from the compressed keys included), DSA's top ``length / 8``
    keys (its indexer's scores and top-k included) and dense attention over the whole cache."""
    heads, d = s["heads"], s["dim"] // s["heads"]
    block = 64 if length >= 1024 else 8
    l, stride, window, top = block // 2, block // 4, 8 * block, max(1, length // 8)
    index_heads, index_dim = 4, 32
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, heads, 1, d, generator=g)
    k, v = torch.randn(1, heads, length, d, generator=g), torch.randn(1, heads, length, d, generator=g)
    blocks_c = (length - l) // stride + 1  # NSA's compressed keys and values, cached as they end
    k_c, v_c = torch.randn(1, heads, blocks_c, d, generator=g), torch.randn(1, heads, blocks_c, d, generator=g)
    q_i, w_i = torch.randn(1, index_heads, index_dim, generator=g), torch.randn(1, 1, index_heads, generator=g)
    k_i = torch.randn(1, index_dim, length, generator=g)  # DSA's cached indexer keys (one head, d_I)

    def nsa():
        o_cmp, o_slc, o_win = nsa_decode(q, k_c, v_c, k, v, k, v, length=l, stride=stride, block=block, count=16,
                                         window=window)
        return o_cmp + o_slc + o_win

    def dsa():
        index = w_i @ torch.relu(q_i @ k_i)  # eq. 1 for the last query: w . ReLU(q_I K_I^T), (1, 1, L)
        idx = index.topk(top, -1, sorted=False).indices.view(1, 1, 1, top)
        return attnkit.attention(q, k, v, mask=masks.selected_keys(idx))

    def dense():
        return attnkit.attention(q, k, v)
    return {"dense": dense, "NSA": nsa, "DSA": dsa}


def _sides(row: str, smoke: bool) -> dict:
    sizes = SMOKE if smoke else FULL
    if row == "packed":
        return dict(zip(("ours", "theirs"), packed_sides(sizes["packed"]), strict=True))
    if row in ("paged", "paged-prefill", "paged-scattered"):
        q_len = 16 if row == "paged-prefill" else 1
        return dict(zip(("ours", "theirs"), paged_sides(sizes["paged"], q_len, row == "paged-scattered"),
                        strict=True))
    length = int(row.split("@")[1])
    if row.startswith("decode"):
        return decode_sides(sizes["sparse"], length)
    if row.startswith("dsa-attention"):
        return dict(zip(("ours", "theirs"), dsa_attention_sides(sizes["sparse"], length), strict=True))
    return sparse_sides(sizes["sparse"], length)


def child(data: dict) -> int:
    """In a fresh process: the bytes the peak grows by while one side of a row runs once."""
    torch.set_num_threads(1)
    side = _sides(data["row"], data["smoke"])[data["side"]]
    base = reset_peak()
    side()
    return peak_bytes() - base


def _peak(row: str, side: str, smoke: bool) -> str:
    try:
        grown = int(child_output("benchmarks.sparse_and_packed", {"row": row, "side": side, "smoke": smoke}, 3600))
    except RuntimeError:
        return "n/a"
    return f"{grown / 2**20:.0f} MiB"


def measure(row: str, rounds: int, smoke: bool, memory: bool) -> list[str]:
    """The table lines of one row: every side's time per call and peak, each against the row's baseline."""
    sides = _sides(row, smoke)
    if row in ("packed", "paged", "paged-prefill", "paged-scattered"):
        torch.testing.assert_close(sides["ours"](), sides["theirs"](), rtol=1e-4, atol=1e-5)  # same function
    times = time_rounds(sides, repeats=rounds, warmup=1)
    base = "theirs" if "theirs" in sides else "dense"
    lines = []
    for name in sides:
        ratios = [a / b for a, b in zip(times[name], times[base], strict=True)]
        peak = _peak(row, name, smoke) if memory else "not measured"
        lines.append(f"| {row} | {name} | {statistics.median(times[name]) * 1e3:.1f} | "
                     f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | {peak} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: check the script, measure nothing")
    ap.add_argument("--no-memory", action="store_true", help="skip the fresh-process peak memory")
    ap.add_argument("--write", type=Path, help="replace this section in a Markdown file")
    ap.add_argument("--only", help="only the rows whose name starts with this (e.g. paged); printed, not written")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    lengths = (SMOKE if args.smoke else FULL)["sparse"]["lengths"]
    rows = (["packed", "paged", "paged-prefill", "paged-scattered"] + [f"sparse@{n}" for n in lengths]
            + [f"dsa-attention@{n}" for n in lengths] + [f"decode@{lengths[-1]}"])
    if args.only:
        rows = [row for row in rows if row.startswith(args.only)]
        if not rows:
            ap.error(f"--only {args.only!r} names no row; rows: packed, paged, paged-prefill, paged-scattered, "
                     "sparse@<L>, dsa-attention@<L>, decode@<L>")
    lines = ["| row | side | ms per call | time / baseline (median, range) | peak memory |", "|---|---|---|---|---|"]
    for row in rows:
        lines += measure(row, args.rounds, args.smoke, not args.no_memory)
        print(lines[-1], file=sys.stderr)
    text = (f"`python benchmarks/sparse_and_packed.py --rounds {args.rounds}` (torch {torch.__version__}, 1 thread; "
            "baseline: `theirs` for packed (SDPA on the padded batch), paged (a contiguous cache) and dsa-attention "
            "(dense causal attention on the same q, k, v), `dense` for the sparse rows; paged-prefill: 16 queries per "
            "sequence, causal; paged-scattered: the pool's pages shuffled; targets: paged <= 1.10x, "
            "paged-prefill <= 1.15x; at 16384 NSA, MoBA <= 0.5x (peak <= 1.5x dense's), DSA <= 0.4x; "
            "at 4096 NSA, MoBA <= 1.0x; dsa-attention at 16384 <= 0.4x; decode NSA, DSA <= 0.5x)\n\n"
            + "\n".join(lines))
    return emit(text, None if args.smoke or args.only else args.write, NAME, TITLE)


if __name__ == "__main__":
    if not run_as_child(child):  # a fresh child process: one measurement
        sys.exit(main())
