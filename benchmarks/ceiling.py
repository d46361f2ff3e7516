"""How close each execution path runs to the machine's one-thread float32 matmul ceiling: the ceiling section.

The rows are measured by :mod:`attnkit.lab.benchmarking.roofline` (``attnkit bench --roofline``
prints the same table); this script adds the notes on what bounds each path and writes the
section into BENCHMARKS.md.

Usage: ``python benchmarks/ceiling.py [--lengths 4096 16384] [--rounds 5] [--write BENCHMARKS.md]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from attnkit.lab.benchmarking.roofline import Config, report, run
from attnkit.lab.benchmarking.sections import emit

NAME, TITLE = "ceiling", "How close each path runs to the matmul ceiling"

NOTES = """What bounds the rest (the profile column, and each path's code):

- `band-windows` (`kernels/band.py`): per slab, two torch `bmm` calls on thin products \
(`(n, bs, D) @ (n, D, W)` and `(n, bs, W) @ (n, W, Dv)`, D = 64), which run near the bmm rows of the \
ceiling rather than the square matmul, and between them one in-place pass of torch's fused softmax and a \
fill of the two masked corners over the slab's scores (in memory, not in registers); the copies are the \
edge blocks' zero-padded windows and, backward, the window gradients added back. The slab size and \
block sizes in use (`band.SLAB`, `band.BLOCK_SIZES`) measured no slower, forward at L = 4096, \
than slabs of 2^19, 2^20 or 2^22 score elements or blocks of 128 alone. Beyond this the softmax pass \
would have to move into the matmul's tiles (a fused kernel).
- `blocksparse-fused` (`kernels/blocksparse_fused.py`): torch's fused kernel per slab does most of the \
work; the rest is gathering each slab's key and value blocks (`index_select`: every key block is copied \
once per query block that reads it, a memory-bound copy of as many bytes as the slab's K and V) and, \
backward, adding their gradients back (`index_add_`).
- `torch-sdpa`: torch's fused kernel alone (scores, softmax and both products in cache-sized tiles); \
its fraction is torch's.
- `dense-reference`: scores and weights exist in memory; its softmax passes over `Lq x Lk` elements \
come on top of the two products.

On a shared machine the ceiling moves with the load; each round divides by the ceiling measured in \
that round, so a row's fraction can exceed 100% in a round where the load changed between the two."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=list(Config.lengths))
    ap.add_argument("--rounds", type=int, default=Config.rounds)
    ap.add_argument("--write", type=Path, help="replace the ceiling section of this Markdown file")
    args = ap.parse_args(argv)
    cfg = Config(lengths=tuple(args.lengths), rounds=args.rounds)
    rows, alone = run(cfg, log=lambda s: print(s, file=sys.stderr))
    command = "python benchmarks/ceiling.py" + (f" --lengths {' '.join(map(str, args.lengths))}"
                                                f" --rounds {args.rounds}")
    text = report(cfg, rows, alone, command, NOTES)
    return emit(text, args.write, NAME, TITLE)


if __name__ == "__main__":
    sys.exit(main())
