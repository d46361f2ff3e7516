"""``attnkit cost`` and ``attnkit scaling``: analytic cost of a mechanism, and measured scaling with length."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

from ...errors import ArgumentError
from ..progress import bars
from .common import add_command, positive_float, positive_int, require_plot
from .sizes import DEFAULTS, VOCABULARY, add_device_arg, add_size_args, mechanism_sizes, title, values

NAME_HELP = 'a registry name (attnkit list), "dense", "sdpa" or a mask expression such as "sliding_window(128, 128)"'
SIZE_HELP = ("a mechanism's own size or option, e.g. --size window=128 (repeatable; attnkit.costing.analytic.sizes "
             "lists them; q_len=, kv_len=, batch=, heads=, head_dim= are the options of those names)")


def _size(text: str) -> tuple[str, object]:
    """``k=v`` with v a Python literal (``4``, ``True``, ``"blocks"``, ``(0, 5)``) or a bare word (a string)."""
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"a size is key=value, e.g. window=128; got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def _kv_cache(args, given: dict) -> None:
    from ...costing.kv_cache import kv_cache_table

    unknown = sorted(set(given) - {"kv_heads", "dtype"})
    if unknown:
        raise ArgumentError(f"attnkit cost --kv-cache: --size takes kv_heads= and dtype= here; got "
                            f"{', '.join(unknown)}")
    layer = {k: v if v is not None else DEFAULTS[k] for k, v in values(args).items()}
    print(kv_cache_table(heads=layer["heads"], head_dim=layer["head_dim"], kv_heads=given.get("kv_heads"),
                         dtype=given.get("dtype", "float32"), tokens=layer["q_len"]))


def _cmd_cost(args) -> int:
    from ...costing.analytic import cost, spec

    given = dict(args.size or [])
    if args.kv_cache or args.name is None:
        if args.name is not None or not args.kv_cache:
            raise ArgumentError("attnkit cost: give a mechanism's name, or --kv-cache alone")
        _kv_cache(args, given)
        return 0
    sizes = {k: v for k, v in values(args).items() if v is not None}  # the options typed (the layer's otherwise)
    sizes.update({k: given.pop(k) for k in VOCABULARY if k in given})
    if not {"q_len", *spec(args.name).length} & {*sizes, *given}:
        sizes["q_len"] = DEFAULTS["q_len"]  # the command prices a realistic layer
    print(cost(args.name, backward=args.backward, **sizes, **given).table())
    return 0


def _writable(option: str, path: str | None) -> None:
    """An output file's folder must exist before minutes of measuring, not after."""
    if path is not None and not Path(path).resolve().parent.is_dir():
        raise ArgumentError(f"{option} {path}: the folder {Path(path).resolve().parent} does not exist")


def _cmd_scaling(args) -> int:
    from ...costing.analytic import sizes
    from ..analysis.scaling import Mechanism, scaling

    viz = require_plot("scaling --out") if args.out else None  # before minutes of measuring, not after
    _writable("--out", args.out)
    _writable("--markdown", args.markdown)
    given, accepted = dict(args.size or []), {name: sizes(name) for name in args.names}
    unused = set(given) - set(VOCABULARY) - {key for keys in accepted.values() for key in keys}
    if unused:  # each mechanism takes the options it has; one that none has is a typo
        raise ArgumentError(f"--size {', '.join(sorted(unused))}: no mechanism of {', '.join(args.names)} takes it")
    rows = [Mechanism(name, name, mechanism_sizes(name, values(args), {k: v for k, v in given.items()
                                                                      if k in accepted[name] or k in VOCABULARY},
                                                  lengths=False))
            for name in args.names]
    with bars(True, len(args.names) * len(args.lengths), "scaling") as step:
        table = scaling(rows, args.lengths, repeats=args.repeats, backward=not args.forward_only,
                        timeout=args.timeout, progress=step, sizes={}, threads=args.threads, device=args.device)
    print(table.markdown())
    if args.markdown:
        Path(args.markdown).write_text(table.markdown() + "\n")
        print(f"table: {args.markdown}")
    if args.out:
        if not table.series():
            raise ArgumentError("attnkit scaling: nothing finished, so there is nothing to plot")
        passes = "forward only" if args.forward_only else "forward + backward"
        sizes = title(values(args))
        viz.scaling_plot(table.series(), path=args.out, title=f"time and peak memory against L ({passes}; {sizes})")
        print(f"plot: {args.out}")
    return 0


def add(sub) -> None:
    p = add_command(sub, "cost", summary="analytic FLOPs, bytes and peak memory of a mechanism at given sizes",
                    description="Count a mechanism's cost at given sizes without running it (arithmetic: no tensor "
                                "of the sequence's size is made): matrix-product FLOPs (as torch's FlopCounterMode "
                                "counts them once given torch's SDPA formulas for the fused CPU kernel, which torch "
                                "2.13's counter counts as 0), elementwise FLOPs, bytes moved and peak memory "
                                "(estimates), term by term, with the formula. The size options go to every mechanism "
                                "in its own names: a module with one sequence length takes --q-len as it, its model "
                                "width is heads x head-dim. The options not given take the paper's settings "
                                "(Longformer's window of 512, BigBird's blocks of 64, Reformer's chunks of 64, ...).",
                    examples=["attnkit cost longformer --q-len 4096", "attnkit cost bigbird --q-len 16384 --heads 12",
                              'attnkit cost "causal() & sliding_window(128, 0)" --backward',
                              "attnkit cost sliding-window --size window=256", "attnkit cost dense --q-len 1000000000",
                              "attnkit cost --kv-cache --heads 32 --head-dim 128 --size dtype=bfloat16"])
    p.add_argument("name", nargs="?", help=NAME_HELP)
    add_size_args(p, defaults=False)
    p.add_argument("--size", type=_size, action="append", metavar="K=V", help=SIZE_HELP)
    p.add_argument("--backward", action="store_true", help="include the backward pass")
    p.add_argument("--kv-cache", action="store_true",
                   help="instead of a mechanism: the decoding cache's bytes per token and layer of MHA, GQA (--size "
                        "kv_heads=, default heads / 4), MQA and MLA side by side at --heads x --head-dim "
                        "(--size dtype=)")
    p.set_defaults(func=_cmd_cost)
    p = add_command(sub, "scaling", summary="time and peak memory over sequence lengths, each in a fresh process",
                    description="Time each mechanism (median of --repeats runs after one warm-up) and measure its "
                                "peak memory (resident on cpu, the CUDA allocator's on cuda) at each length L, each "
                                "(mechanism, L) in a fresh process; print the table with the fitted exponents of "
                                "time ~ L^p, and optionally plot it. Every length of a mechanism is set to L.",
                    examples=['attnkit scaling dense "sliding_window(128,128)" --lengths 1024 2048 4096 '
                              '--out scaling.png',
                              "attnkit scaling longformer linformer --lengths 512 1024 --forward-only --threads 1"])
    p.add_argument("names", nargs="+", help=NAME_HELP + " (several)")
    add_size_args(p, lengths=False)
    p.add_argument("--lengths", type=positive_int, nargs="+", default=[512, 1024, 2048, 4096],
                   help="sequence lengths L")
    p.add_argument("--repeats", type=positive_int, default=3, help="timed runs per (mechanism, L)")
    p.add_argument("--size", type=_size, action="append", metavar="K=V", help=SIZE_HELP)
    p.add_argument("--timeout", type=positive_float, default=120.0,
                   help="seconds per (mechanism, L); longer L are skipped")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads in each child process")
    p.add_argument("--forward-only", action="store_true", help="time the forward pass only")
    p.add_argument("--out", default=None, metavar="PNG", help="write a log-log plot (needs matplotlib)")
    p.add_argument("--markdown", default=None, metavar="FILE", help="also write the table to FILE")
    add_device_arg(p, "where each mechanism runs")
    p.set_defaults(func=_cmd_scaling)
