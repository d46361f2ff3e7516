"""``attnkit cost`` and ``attnkit scaling``: analytic cost of a mechanism, and measured scaling with length."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

from ..analysis.cost import cost
from ..analysis.scaling import DEFAULT_SIZES, scaling
from ..errors import ArgumentError
from ..progress import progress


def _size(text: str) -> tuple[str, object]:
    """``k=v`` with v a Python literal (``4``, ``True``, ``"blocks"``, ``(0, 5)``) or a bare word (a string)."""
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"a size is key=value, e.g. q_len=4096; got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def _sizes(pairs) -> dict:
    return dict(pairs or [])


def _cmd_cost(args) -> int:
    print(cost(args.name, backward=args.backward, **_sizes(args.size)).table())
    return 0


def _plot(table, path: str) -> str:
    """Draw the plot, or say why not (attnkit.viz or matplotlib missing)."""
    try:
        from ..viz import scaling_plot

        scaling_plot(table.series(), path=path)
    except ImportError as err:
        return f"no plot written: {err}"
    return f"plot: {path}"


def _cmd_scaling(args) -> int:
    sizes = {**DEFAULT_SIZES, **_sizes(args.size)} if args.size else None
    step = progress(len(args.names) * len(args.lengths), "scaling")
    table = scaling(args.names, args.lengths, repeats=args.repeats, backward=not args.forward_only,
                    timeout=args.timeout, progress=step, sizes=sizes, threads=args.threads)
    print(table.markdown())
    if args.markdown:
        Path(args.markdown).write_text(table.markdown() + "\n")
        print(f"table: {args.markdown}")
    if args.out:
        if not table.series():
            raise ArgumentError("attnkit scaling: nothing finished, so there is nothing to plot")
        print(_plot(table, args.out))
    return 0


def add(sub) -> None:
    p = sub.add_parser("cost", help="analytic FLOPs, bytes and peak memory of a mechanism at given sizes")
    p.add_argument("name", help='a registry name (attnkit list), "dense", "sdpa" or a mask expression')
    p.add_argument("--size", type=_size, action="append", metavar="K=V",
                   help="a size or option, e.g. --size q_len=4096 --size window=128 (repeatable)")
    p.add_argument("--backward", action="store_true", help="include the backward pass")
    p.set_defaults(func=_cmd_cost)
    p = sub.add_parser("scaling", help="time and peak memory over sequence lengths, each in a fresh process")
    p.add_argument("names", nargs="+", help='registry names, "dense", "sdpa" or mask expressions')
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--size", type=_size, action="append", metavar="K=V",
                   help="sizes for every mechanism that takes them (default batch=1 heads=8 head_dim=64 dim=512)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per (mechanism, L); longer L are skipped")
    p.add_argument("--threads", type=int, default=None, help="torch threads in each child process")
    p.add_argument("--forward-only", action="store_true", help="time the forward pass only")
    p.add_argument("--out", default=None, metavar="PNG", help="write a log-log plot (needs attnkit.viz, matplotlib)")
    p.add_argument("--markdown", default=None, metavar="FILE", help="also write the table to FILE")
    p.set_defaults(func=_cmd_scaling)
