"""What learned attention sinks cost: the same call with and without ``sinks=``, as a time ratio per round.

Rows (B=1, H=8, D=64, float32, 1 thread; forward, and forward+backward with gradients for q, k, v
and the sinks), one per path a sink changes: no mask and causal (torch's kernel, its lse joined
with the sinks, its backward from the joined pair), a causal sliding window (band windows: the
sinks joined after, the lse gradient through their backward), causal & strided (the fused
block-sparse slabs) and ALiBi (bias slabs). The sinks are -30: each takes about ``e^-30`` of a
row, so both sides give the same result (checked before timing) while the sink call does all of
its work. Target: at most 1.05x. Measured by :func:`attnkit.lab.benchmarking.pairs.measure` (the one
timing loop, a ratio per interleaved round).

Usage: ``python benchmarks/sinks.py [--length 4096] [--rounds 9] [--write BENCHMARKS.md]``.
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

NAME, TITLE = "sinks", "Attention sinks: the same call with and without sinks"
GOAL = 1.05
CALLS = {
    "no mask": {},
    "causal": {"mask": masks.causal()},
    "causal & sliding_window(256)": {"mask": masks.causal() & masks.sliding_window(256)},
    "causal & strided(64)": {"mask": masks.causal() & masks.strided(64)},
    "ALiBi, causal": {"bias": attnkit.bias.alibi(8), "mask": masks.causal()},
}


def _side(q, k, v, kwargs, sinks, backward: bool):
    leaves = [t for t in (q, k, v, sinks) if t is not None]

    def run():
        if not backward:
            with torch.no_grad():
                return attnkit.attention(q, k, v, sinks=sinks, **kwargs)
        for t in leaves:
            t.grad = None
        out = attnkit.attention(q, k, v, sinks=sinks, **kwargs)
        out.sum().backward()
        return out.detach()
    return run


def pairs(length: int, backward: bool) -> list[Pair]:
    """One pair per call: with sinks (ours) and without (theirs), on the same inputs."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, length, 64, generator=g).requires_grad_(backward) for _ in range(3))
    sinks = torch.full((8,), -30.0, requires_grad=backward)
    rows = []
    for name, kwargs in CALLS.items():
        path = attnkit.explain(q, k, v, sinks=sinks, **kwargs).path
        label = f"{name}, L={length}{', fwd+bwd' if backward else ''} ({path})"
        rows.append(Pair(label, GOAL, _side(q, k, v, kwargs, sinks, backward), _side(q, k, v, kwargs, None, backward),
                         "the same call without sinks"))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--write", type=Path, help="replace the sinks section in this Markdown file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for backward in (False, True):
        for row in pairs(args.length, backward):
            results.append(measure(row, args.rounds, budget_s=0.0, min_calls=1))
            print(f"{row.name}: {results[-1]['ratio']:.3f}x", file=sys.stderr)
    text = (f"`python benchmarks/sinks.py --length {args.length} --rounds {args.rounds}` (torch {torch.__version__}, "
            "1 thread; ratio = time with sinks / time without, per interleaved round)\n\n" + table(results, "ms"))
    return emit(text, args.write, NAME, TITLE)


if __name__ == "__main__":
    sys.exit(main())
