"""``attnkit plot-mask``: draw a mask expression (and its block layout) to a PNG or SVG file."""

from __future__ import annotations

import sys

from ..errors import ArgumentError
from ..functional.mask_parse import parse


def _cmd_plot_mask(args) -> int:
    try:
        from ..viz import mask_density, mask_picture
        from ..viz._mask_eval import _DENSE_LIMIT  # entries up to which the density counts every entry
    except ImportError as err:  # pragma: no cover - only without matplotlib
        print(f"attnkit: error: {err}", file=sys.stderr)
        return 2
    mask = parse(args.expr)
    kv_len = args.kv_len if args.kv_len is not None else args.q_len
    try:
        mask_picture(mask, args.q_len, kv_len, block_size=args.block_size, path=args.out)
    except OSError as err:
        raise ArgumentError(f"cannot write --out {args.out!r}: {err.strerror or err} ({err.filename or args.out})") \
            from None
    print(f"wrote {args.out}")
    size = f"{args.q_len} queries x {kv_len} keys"
    if args.block_size is not None:
        density = mask_density(mask, args.q_len, kv_len, block_size=args.block_size)
        print(f"block density: {density:.4f} (block size {args.block_size}, {size})")
    else:
        density = mask_density(mask, args.q_len, kv_len)
        how = "" if args.q_len * kv_len <= _DENSE_LIMIT else ", estimated from 16 samples per drawn cell"
        print(f"allowed fraction: {density:.4f} ({size}{how}; --block-size gives the block density)")
    return 0


def add(sub) -> None:
    p = sub.add_parser("plot-mask", help="draw a mask expression and its block layout to a PNG or SVG file")
    p.add_argument("expr", help='mask expression, e.g. "causal() & sliding_window(128, 0)"')
    p.add_argument("--q-len", type=int, required=True)
    p.add_argument("--kv-len", type=int, default=None, help="default: q-len")
    p.add_argument("--block-size", type=int, default=None, help="overlay the block layout for this block size")
    p.add_argument("--out", default="attnkit-mask.png", help="output file, .png or .svg (default: %(default)s)")
    p.set_defaults(func=_cmd_plot_mask)
