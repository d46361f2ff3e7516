"""attnkit under ``torch.compile``: the window row of the suite with both sides compiled, as ratios in one run.

A module calling ``attention(q, k, v, mask=masks.sliding_window(128, 128))`` at L = 4096
(B=1, H=8, D=64, float32, 1 thread), compiled with ``fullgraph=True``, forward and
forward+backward, against:

- the same call with torch SDPA and the dense bool mask, compiled the same way
  (target: attnkit at least 5x faster, ratio <= 0.2);
- attnkit's own eager call (target: compiled <= 1.15x eager).

Compiling keeps the band-windows path because the call becomes one
``attnkit::attention`` custom operator (``src/attnkit/kernels/custom_op.py``).
Every row is the suite's own row code (:mod:`attnkit.lab.benchmarking.rows`), so
``attnkit bench --compile --compare compiled-sdpa-mask,attnkit-eager --q-len 4096
--mask "sliding_window(128, 128)" --threads 1`` reproduces it.

Usage: ``python -m benchmarks.compiled [--quick] [--repeats 5] [--write BENCHMARKS.md]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from attnkit.lab.analysis.timing import Case
from attnkit.lab.benchmarking.report import rows_table
from attnkit.lab.benchmarking.rows import Spec, run_spec
from attnkit.lab.benchmarking.sections import emit

NAME, TITLE = "compiled", "attnkit under torch.compile"
WINDOW = "sliding_window(128, 128)"
COMPARE = ("compiled-sdpa-mask", "attnkit-eager")
GOALS = (0.2, 1.15)


def specs(length: int = 4096, heads: int = 8, repeats: int = 5) -> list[Spec]:
    """The compiled window rows: forward, and forward+backward."""
    return [Spec(6, "window ±128, compiled", Case(1, heads, length, head_dim=64, mask=WINDOW, backward=backward),
                 COMPARE, GOALS, repeats, compiled=True) for backward in (False, True)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="L=512, 2 heads, 2 repeats (a smoke run)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--write", type=Path, help="replace the compiled section of this Markdown file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    chosen = specs(512, 2, 2) if args.quick else specs(repeats=args.repeats)
    rows = []
    for spec in chosen:
        rows += run_spec(spec, progress=lambda text: print(text, file=sys.stderr))
    text = (f"`python -m benchmarks.compiled --repeats {args.repeats}` (torch {torch.__version__}, 1 thread; both "
            "sides compiled with fullgraph=True, compile time excluded; ratio = attnkit time / other time, "
            "medians over interleaved rounds)\n\n" + "\n".join(rows_table(rows)))
    return emit(text, args.write, NAME, TITLE)


if __name__ == "__main__":
    sys.exit(main())
