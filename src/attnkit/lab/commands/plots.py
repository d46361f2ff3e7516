"""``attnkit plot-mask``: draw a mask expression (and its block layout) to a PNG or SVG file."""

from __future__ import annotations

from ...errors import ArgumentError
from .common import add_command, positive_int, require_plot
from .sizes import add_size_args


def _cmd_plot_mask(args) -> int:
    from ...masks import parse

    mask = parse(args.expr)  # a bad expression is reported before matplotlib is asked for
    viz = require_plot("plot-mask")
    from ..viz._mask_eval import _DENSE_LIMIT  # entries up to which the density counts every entry

    kv_len = args.kv_len if args.kv_len is not None else args.q_len
    try:
        viz.mask_picture(mask, args.q_len, kv_len, block_size=args.block_size, path=args.out)
    except OSError as err:
        raise ArgumentError(f"cannot write --out {args.out!r}: {err.strerror or err} ({err.filename or args.out})") \
            from None
    print(f"wrote {args.out}")
    size = f"{args.q_len} queries x {kv_len} keys"
    if args.block_size is not None:
        density = viz.mask_density(mask, args.q_len, kv_len, block_size=args.block_size)
        print(f"block density: {density:.4f} (block size {args.block_size}, {size})")
    else:
        density = viz.mask_density(mask, args.q_len, kv_len)
        how = "" if args.q_len * kv_len <= _DENSE_LIMIT else ", estimated from 16 samples per drawn cell"
        print(f"allowed fraction: {density:.4f} ({size}{how}; --block-size gives the block density)")
    return 0


def add(sub) -> None:
    p = add_command(sub, "plot-mask", summary="draw a mask expression and its block layout to a PNG or SVG file",
                    description="Draw which (query, key) pairs a mask expression lets attend, and with --block-size "
                                "which blocks a block-sparse kernel computes fully, partly or skips; print the "
                                "fraction of allowed entries (or the block density). Needs matplotlib "
                                '(pip install "attnkit[plot]").',
                    examples=['attnkit plot-mask "causal() & sliding_window(64)" --q-len 1024 --block-size 64 '
                              "--out mask.png",
                              'attnkit plot-mask "global_tokens([0]) | sliding_window(8, 8)" --q-len 64 --out g.svg'])
    p.add_argument("expr", help='mask expression, e.g. "causal() & sliding_window(128, 0)"')
    add_size_args(p, shape=False)
    p.add_argument("--block-size", type=positive_int, default=None,
                   help="overlay the block layout for this block size (default: no layout)")
    p.add_argument("--out", default="attnkit-mask.png", help="output file, .png or .svg")
    p.set_defaults(func=_cmd_plot_mask)
