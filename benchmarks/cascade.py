"""Shared-prefix (cascade) attention against the calls a user would otherwise make, as time ratios per round.

Rows: ``N`` requests over one ``P``-token prefix, each with its own ``S``-token suffix, queries the
last ``Lq`` positions of each request (``Lq = 1``: a decode step; ``Lq = S``: the suffixes'
prefill), causal, float32, 1 thread, H = 8 query heads over 2 key heads (GQA), D = 64.

- ours: :func:`attnkit.cascade_attention` (the prefix read once for all ``N Lq`` stacked queries,
  one call per suffix, merged by log-sum-exp);
- theirs: the ``N`` ordinary calls ``attention(q_r, cat(prefix, suffix_r), mask=causal())``, and in a
  second row one batched call over a ``(N, H_kv, P + S, D)`` cache holding the prefix ``N`` times
  (built before timing, so its copy is not counted).

Both sides' results are compared before timing. Target: below 1.0x (the point of the route).

Usage: ``python benchmarks/cascade.py [--requests 16] [--prefix 4096] [--suffix 16] [--rounds 9]
[--write BENCHMARKS.md]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import attnkit
from attnkit import masks
from attnkit.lab.benchmarking.pairs import Pair, measure, table
from attnkit.lab.benchmarking.sections import emit

NAME, TITLE = "cascade", "Shared prefixes: the cascade against ordinary calls"
GOAL = 1.0
HEADS, KV_HEADS, DIM = 8, 2, 64


def pairs(n: int, p: int, s: int) -> list[Pair]:
    """For ``Lq`` in (1, ``s``): the cascade against ``n`` ordinary calls and against one batched call."""
    g = torch.Generator().manual_seed(0)
    pk, pv = (torch.randn(KV_HEADS, p, DIM, generator=g) for _ in range(2))
    sk, sv = (torch.randn(n, KV_HEADS, s, DIM, generator=g) for _ in range(2))
    full_k = torch.cat([pk.expand(n, -1, -1, -1), sk], dim=2).contiguous()
    full_v = torch.cat([pv.expand(n, -1, -1, -1), sv], dim=2).contiguous()
    rows = []
    for lq in sorted({1, s}):
        q = torch.randn(n, HEADS, lq, DIM, generator=g)

        def cascade(q=q):
            with torch.no_grad():
                return attnkit.cascade_attention(q, pk, pv, sk, sv)

        def one_by_one(q=q):
            with torch.no_grad():
                return torch.cat([attnkit.attention(q[r:r + 1], full_k[r:r + 1], full_v[r:r + 1], mask=masks.causal())
                                  for r in range(n)])

        def batched(q=q):
            with torch.no_grad():
                return attnkit.attention(q, full_k, full_v, mask=masks.causal())

        label = f"{n} requests, prefix {p}, suffix {s}, q_len {lq}"
        rows.append(Pair(label, GOAL, cascade, one_by_one, f"{n} ordinary calls"))
        rows.append(Pair(label, GOAL, cascade, batched, f"one batched call, prefix copied {n} times"))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--prefix", type=int, default=4096)
    ap.add_argument("--suffix", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--write", type=Path, help="replace the cascade section in this Markdown file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for row in pairs(args.requests, args.prefix, args.suffix):
        results.append(measure(row, args.rounds, budget_s=0.05, min_calls=3, warmup=1))
        print(f"{row.name} vs {row.against}: {results[-1]['ratio']:.3f}x", file=sys.stderr)
    text = (f"`python benchmarks/cascade.py --requests {args.requests} --prefix {args.prefix} --suffix {args.suffix} "
            f"--rounds {args.rounds}` (torch {torch.__version__}, 1 thread, H = {HEADS} over {KV_HEADS} key heads, "
            f"D = {DIM}, float32, causal; ratio = cascade time / the other side's time, per interleaved round)\n\n"
            + table(results, "ms"))
    return emit(text, args.write, NAME, TITLE)


if __name__ == "__main__":
    sys.exit(main())
