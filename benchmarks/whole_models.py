"""Whole models, attnkit against plain torch, written into BENCHMARKS.md's "Whole models" section.

The rows are :mod:`attnkit.lab.benchmarking.whole_models` (``attnkit bench --models`` runs the
same); see there for the models, the rows and their targets.

Usage: ``python -m benchmarks.whole_models [--rounds 5] [--rows causal,window,lm,generate]
[--sizes length=256,batch=2] [--compiled] [--write BENCHMARKS.md]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from attnkit.lab.benchmarking.sections import emit
from attnkit.lab.benchmarking.whole_models import ROWS, Sizes, parse_rows, parse_sizes, report, run
from attnkit.lab.commands.bench_models import argparse_type

NAME, TITLE = "models", "Whole models"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=argparse_type(parse_rows), default=ROWS, help="all or " + ",".join(ROWS))
    ap.add_argument("--sizes", type=argparse_type(parse_sizes), default=Sizes(), help="e.g. length=256,batch=2")
    ap.add_argument("--compiled", action="store_true", help="also every row with both sides torch.compile'd")
    ap.add_argument("--write", type=Path, help="replace the whole-model table in this Markdown file")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    text = report(args, run(args.sizes, args.rows, rounds=args.rounds, compiled=args.compiled,
                            log=lambda line: print(line, file=sys.stderr)))
    return emit(text, args.write, NAME, TITLE)


if __name__ == "__main__":
    sys.exit(main())
