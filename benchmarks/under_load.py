"""A band window against torch's SDPA on a quiet and on an oversubscribed machine: the under-load section.

Row: window +-128 forward at L = 4096 (8 heads, D = 64), torch's default threads, against
SDPA with the dense boolean mask, first quiet, then with ``--per-core`` busy-loop processes
on every core (started here, stopped after), which run ``--settle`` seconds before the busy
rounds. The band path runs its slabs as runs of heads on torch's threads, each operator
on one (:func:`attnkit.kernels.pipeline.in_threads`), so no operator waits at a barrier
for a thread that lost its core. Target: the busy ratio at most 1.5x the quiet one.

Usage: ``python benchmarks/under_load.py [--length 4096] [--per-core 3] [--rounds 5] [--settle 5]
[--write BENCHMARKS.md]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import attnkit
from attnkit import masks
from attnkit.lab.benchmarking.pairs import Pair, measure
from attnkit.lab.benchmarking.sections import emit

NAME, TITLE = "under-load", "Band windows on a busy machine"
GOAL = 1.5  # the busy ratio over the quiet ratio
_BUSY = "while True: pass"


def row(length: int, window: int = 128, heads: int = 8, d: int = 64) -> Pair:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, length, d, generator=g) for _ in range(3))
    mask = masks.sliding_window(window, window)
    dense = mask.materialize(length, length)[0, 0]
    return Pair(f"window +-{window} fwd, L = {length}", GOAL, lambda: attnkit.attention(q, k, v, mask=mask),
                lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense), "SDPA, dense mask")


def busy(count: int) -> list[subprocess.Popen]:
    """``count`` processes spinning in Python until stopped."""
    return [subprocess.Popen([sys.executable, "-c", _BUSY]) for _ in range(count)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()


def render(command: str, quiet: dict, loaded: dict, per_core: int, cores: int, loads: tuple) -> str:
    change = loaded["ratio"] / quiet["ratio"]
    lines = [f"`{command}` (torch {torch.__version__}, {torch.get_num_threads()} threads, {cores} cores; ratio = "
             f"attnkit time / SDPA time per interleaved round; busy: {per_core} busy-loop processes per core, "
             f"load average {loads[0]:.1f} before and {loads[1]:.1f} after the busy rounds)", "",
             "| row | machine | attnkit ms | SDPA ms | ratio (median, range) |", "|---|---|---|---|---|"]
    for name, r in (("quiet", quiet), ("busy", loaded)):
        lines.append(f"| {r['name']} | {name} | {r['ours_us'] / 1e3:.1f} | {r['theirs_us'] / 1e3:.1f} | "
                     f"{r['ratio']:.3f}x ({r['lo']:.3f}-{r['hi']:.3f}) |")
    lines += ["", f"Busy ratio over quiet ratio: {change:.2f}x (target <= {GOAL:.1f}x: "
                  f"{'met' if change <= GOAL else 'missed'})."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--per-core", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--settle", type=float, default=5.0, help="seconds the busy processes run before timing")
    ap.add_argument("--write", type=Path, help="replace the under-load section in this Markdown file")
    args = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    pair = row(args.length)
    quiet = measure(pair, args.rounds, budget_s=0.0, min_calls=3)
    procs = busy(args.per_core * cores)
    try:
        time.sleep(args.settle)
        before = os.getloadavg()[0]
        loaded = measure(pair, args.rounds, budget_s=0.0, min_calls=3)
        after = os.getloadavg()[0]
    finally:
        stop(procs)
    command = (f"python benchmarks/under_load.py --length {args.length} --per-core {args.per_core} "
               f"--rounds {args.rounds} --settle {args.settle:g}")
    text = render(command, quiet, loaded, args.per_core, cores, (before, after))
    return emit(text, args.write, NAME, TITLE)


if __name__ == "__main__":
    raise SystemExit(main())
