"""``attnkit bench``: time attnkit against torch on the same inputs; any row of the benchmark suite.

Five modes, all running the installed package's code (:mod:`attnkit.lab.benchmarking`, timed by
:mod:`attnkit.lab.analysis.timing`): the default table (attnkit's backends side by side with
torch SDPA), ``--compare KIND[,KIND...]`` (a row of the suite: attnkit and each comparison
interleaved, max |diff| of every pair, GFLOP/s, optional memory), ``--models`` (whole
models), ``--roofline`` (each path's fraction of the matmul ceiling) and ``--distributed``
(sequence parallelism on local processes). Every option is checked before anything runs:
a bad value, two modes at once, or an option the chosen mode does not use is one line,
``attnkit: error: ...``, exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from ...errors import ArgumentError, did_you_mean
from ..progress import announce, bars, duration
from .bench_models import add_model_args
from .common import add_command, positive_float, positive_int
from .inspect import add_case_args, case_from_args
from .sizes import add_device_arg

BIAS_NAMES = ("alibi", "relpos", "softcap")  # attnkit.lab.analysis.patterns.BIASES, which imports torch (a test checks)
BACKENDS = ("auto", "blocksparse", "chunked", "sdpa")  # the default table's; any of attnkit's may be asked for

DESCRIPTION = """\
Time attnkit against torch on the same inputs, or run any row of the benchmark suite.

Without a mode: attnkit's backends side by side with torch SDPA (no mask, and the dense
bool mask a torch user would build), interleaved, medians of --repeats rounds, and the max
abs difference of each output from SDPA's. --compare KIND[,KIND...]: the suite's own row
code for these sizes (attnkit and each comparison interleaved, max |diff| of every pair,
GFLOP/s, optional memory). --models: whole models against plain torch. --roofline: each
path's fraction of the matmul ceiling. --distributed: sequence-parallel schemes on local
processes. Each option applies to the modes that use it; another is an error."""

COMPARE_HELP = ("backends (default): attnkit's backends and SDPA; or comma-separated suite comparisons: "
                "sdpa (SDPA as called for the mask: no mask, is_causal, key mask), sdpa-mask (dense bool mask), "
                "sdpa-bias (dense float bias), eager (plain torch), flex (compiled FlexAttention), fp32 "
                "(attnkit in float32; for --dtype bfloat16), compiled-sdpa-mask (sdpa-mask under torch.compile), "
                "attnkit-eager (attnkit not compiled; with --compile), "
                "additive (AdditiveAttention vs broadcast-then-tanh: "
                "--batch, --q-len, --kv-len and --head-dim as the width)")

TABLE, COMPARE, MODELS, ROOFLINE, DISTRIBUTED = "table", "compare", "models", "roofline", "distributed"
EVERY = frozenset({TABLE, COMPARE, MODELS, ROOFLINE, DISTRIBUTED})
# The modes each option is used by: setting it to another value than its default in another mode is an error.
SCOPE = {
    "batch": {TABLE, COMPARE, DISTRIBUTED}, "heads": {TABLE, COMPARE, DISTRIBUTED, ROOFLINE},
    "q_len": {TABLE, COMPARE, DISTRIBUTED}, "kv_len": {TABLE, COMPARE},
    "head_dim": {TABLE, COMPARE, DISTRIBUTED, ROOFLINE},
    "dtype": {TABLE, COMPARE, DISTRIBUTED}, "mask": {TABLE, COMPARE, DISTRIBUTED}, "bias": {TABLE, COMPARE},
    "backward": {TABLE, COMPARE, DISTRIBUTED}, "repeats": EVERY, "backends": {TABLE}, "backend": {COMPARE},
    "goal": {COMPARE}, "memory_goal": {COMPARE}, "compile": {COMPARE}, "ceiling": {COMPARE}, "profile": {COMPARE},
    "memory": {TABLE, COMPARE}, "retain_memory": {TABLE, COMPARE}, "threads": {TABLE, COMPARE, MODELS, DISTRIBUTED},
    "procs": {DISTRIBUTED}, "model_sizes": {MODELS}, "compiled": {MODELS}, "device": {TABLE, COMPARE, MODELS},
}
MODE_NAMES = {TABLE: "the default table", COMPARE: "--compare", MODELS: "--models", ROOFLINE: "--roofline",
              DISTRIBUTED: "--distributed"}
ADDITIVE_UNUSED = ("heads", "mask", "bias", "backend", "compile")  # AdditiveAttention is not attention()


def _option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _compare(text: str) -> tuple[str, ...]:
    from ..benchmarking.methods import KINDS

    if text == "backends":
        return ()
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    known = ("backends", "additive", *KINDS)
    bad = [k for k in kinds if k not in known]
    if not kinds or bad:
        hint = did_you_mean(bad[0], known) if bad else ""
        raise argparse.ArgumentTypeError(f"unknown comparison {', '.join(map(repr, bad)) or repr(text)}; {hint}"
                                         f"use backends, additive, or any of {', '.join(KINDS)}")
    if "additive" in kinds and len(kinds) > 1:
        raise argparse.ArgumentTypeError("additive is compared alone (it is another module, not attention())")
    return kinds


def _bias(text: str) -> str:
    if text not in BIAS_NAMES:
        raise argparse.ArgumentTypeError(f"unknown bias {text!r}; {did_you_mean(text, BIAS_NAMES)}"
                                         f"biases: {', '.join(BIAS_NAMES)}")
    return text


def _backend(text: str) -> str:
    """``--backend``: one of attnkit's backends (did-you-mean for a typo)."""
    from ...kernels.paths import BACKENDS as ALL

    if text not in ALL:
        raise argparse.ArgumentTypeError(f"unknown backend {text!r}; {did_you_mean(text, ALL)}"
                                         f"backends: {', '.join(ALL)}")
    return text


def _backends(text: str) -> tuple[str, ...]:
    """``--backends``: attnkit backends, comma-separated."""
    names = tuple(b.strip() for b in text.split(",") if b.strip())
    if not names:
        raise argparse.ArgumentTypeError(f"name at least one backend; got {text!r}")
    return tuple(_backend(name) for name in names)


def mode(args) -> str:
    """The mode the options ask for; ArgumentError when they ask for two."""
    asked = [m for m, on in ((COMPARE, args.compare), (MODELS, args.models is not None),
                             (ROOFLINE, args.roofline is not None), (DISTRIBUTED, args.distributed)) if on]
    if len(asked) > 1:
        raise ArgumentError(f"{' and '.join(MODE_NAMES[m] for m in asked)} are separate modes: give one of them")
    return asked[0] if asked else TABLE


def check(args) -> str:
    """The mode, once every option is known to apply to it and the mask to parse (ArgumentError otherwise)."""
    chosen = mode(args)
    for dest, modes in SCOPE.items():
        if chosen not in modes and getattr(args, dest) != args.option_defaults[dest]:
            used = ", ".join(MODE_NAMES[m] for m in sorted(modes, key=list(MODE_NAMES).index))
            raise ArgumentError(f"{_option(dest)} does not apply to {MODE_NAMES[chosen]} (it applies to {used})")
    if args.compare == ("additive",):
        for dest in ADDITIVE_UNUSED:
            if getattr(args, dest) != args.option_defaults[dest]:
                raise ArgumentError(f"{_option(dest)} does not apply to --compare additive (AdditiveAttention takes "
                                    "--batch, --q-len, --kv-len, --head-dim)")
    if args.mask and chosen == DISTRIBUTED:
        from ...masks import parse

        parse(args.mask)
    elif args.mask:
        from ..analysis.patterns import make_mask

        make_mask(args.mask, args.q_len)
    return chosen


def _case(args, backward: bool):
    return dataclasses.replace(case_from_args(args, backward), bias=args.bias, device=args.device)


def _backends_table(args, backward: bool) -> None:
    from ..analysis.timing import peak_memory, run_case

    backends = args.backends or BACKENDS
    case = _case(args, backward)
    refused: dict[str, str] = {}
    with bars(True, 1, "bench") as step:  # one step: the methods are timed together, interleaved
        rows = run_case(case, repeats=args.repeats, backends=backends, progress=step, refused=refused)
    peaks = {}
    with bars(args.memory, len(rows), "memory") as step:
        for r in rows if args.memory else ():
            step(f"{r.method}")
            peaks[r.method] = peak_memory(case, r.method, backends)
    for backend, why in refused.items():  # asked for, not run: said, never dropped silently
        print(f"attnkit: warning: backend {backend!r} is not in the table: {why}", file=sys.stderr)
    base = next((r for r in rows if r.method == "torch sdpa (dense bool mask)"), rows[0])
    print(f"\n{'forward+backward' if backward else 'forward'}: {case}")
    print("| method | median ms | min-max ms | time vs " + base.method + " | max abs diff |")
    print("|---|---|---|---|---|")
    for r in rows:
        diff = (r.output.float() - base.output.float()).abs().max().item()
        print(f"| {r.method} | {r.median_s * 1e3:.1f} | {r.min_s * 1e3:.1f}-{r.max_s * 1e3:.1f} | "
              f"{r.median_s / base.median_s:.3f}x | {diff:.2e} |")
    if args.memory:
        where = "device allocator" if args.device != "cpu" else "resident"
        print(f"\n| method | peak extra memory MiB ({where}, fresh process) |\n|---|---|")
        for method, peak in peaks.items():
            print(f"| {method} | {peak / 2**20:.1f} |")


def _suite_rows(args, backward: bool) -> None:
    from ..benchmarking.machine import ceiling
    from ..benchmarking.report import misses, rows_table
    from ..benchmarking.rows import Spec, run_spec

    case = _case(args, backward)
    label = "additive" if args.compare == ("additive",) else args.mask or args.bias or "no mask"
    spec = Spec(0, label, case, args.compare, (args.goal,) if args.goal is not None else (), args.repeats,
                memory=args.memory, mem_goal=args.memory_goal, backend=args.backend or "auto", compiled=args.compile)
    steps = 3 + bool(args.ceiling) + bool(args.memory) + bool(args.profile)
    with bars(True, steps, "bench") as step:
        if args.ceiling:
            step("matmul ceiling")
        peak = {k: v["all"] for k, v in ceiling(seconds=0.5).items()} if args.ceiling else None
        rows = run_spec(spec, ceiling=peak, progress=step, profile_misses=args.profile)
    print(f"\n{'forward+backward' if backward else 'forward'}:")
    print("\n".join(rows_table(rows)))
    if any(r.verdict in ("MISS", "WRONG") for r in rows):
        print("\n" + "\n".join(misses(rows)))


def _roofline(args) -> int:
    """The ceiling section of BENCHMARKS.md (:mod:`attnkit.lab.benchmarking.roofline`) for the given lengths and sizes.
    """
    from ..benchmarking import roofline

    lengths = tuple(args.roofline) or roofline.Config.lengths
    cfg = roofline.Config(lengths=lengths, heads=args.heads, head_dim=args.head_dim, rounds=args.repeats)
    with bars(True, sum(not row.skipped for row in roofline.rows_for(cfg)), "roofline") as step:
        rows, alone = roofline.run(cfg, log=step)
    command = f"attnkit bench --roofline {' '.join(map(str, lengths))} --repeats {args.repeats}"
    print(roofline.report(cfg, rows, alone, command))
    return 0


def _distributed(args) -> int:
    from ..benchmarking import distributed as distributed_bench  # starts processes: imported only when asked

    specs = [distributed_bench.Spec(procs=args.procs, batch=args.batch, heads=args.heads, length=args.q_len,
                                    head_dim=args.head_dim, dtype=args.dtype, mask=args.mask, backward=backward,
                                    repeats=args.repeats, threads=args.threads or 1)
             for backward in ([False, True] if args.backward == "both" else [args.backward == "yes"])]
    rows = sum(len(distributed_bench.pairs(spec)) for spec in specs)
    seconds = sum(distributed_bench.estimate_seconds(spec) for spec in specs)
    announce(f"attnkit bench --distributed: {rows} rows of {args.repeats + 2} calls each on {args.procs} processes; "
             f"{duration(seconds)} by the FLOP estimate at the speed of BENCHMARKS.md's 2-core run "
             "(attnkit.lab.benchmarking.distributed.estimate_seconds); smaller --q-len or --repeats shorten it")
    with bars(True, rows, "distributed") as step:
        for spec in specs:
            table = distributed_bench.rows_table(spec, distributed_bench.measure(spec, progress=step))
            print("\n" + "\n".join(table), flush=True)
    return 0


def _cmd_bench(args) -> int:
    chosen = check(args)
    if chosen == DISTRIBUTED:
        return _distributed(args)
    if chosen == ROOFLINE:
        return _roofline(args)
    if chosen == MODELS:
        from .bench_models import run_models

        return run_models(args)
    import torch

    from ...runtime import retain_freed_memory

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.retain_memory:
        retain_freed_memory()
    for backward in ([False, True] if args.backward == "both" else [args.backward == "yes"]):
        (_suite_rows if chosen == COMPARE else _backends_table)(args, backward)
    return 0


def add(sub) -> None:
    p = add_command(sub, "bench", summary="time attnkit against torch SDPA / FlexAttention on the same inputs",
                    description=DESCRIPTION,
                    examples=['attnkit bench --q-len 4096 --mask "sliding_window(128, 128)" --memory',
                              'attnkit bench --compare flex --q-len 4096 --mask "sliding_window(128, 128)"   '
                              '# a row of BENCHMARKS.md',
                              "attnkit bench --bias alibi --backward no --repeats 3",
                              "attnkit bench --roofline 4096   # fraction of the matmul ceiling per path",
                              "attnkit bench --models all --compiled   # the whole-model rows of BENCHMARKS.md",
                              "attnkit bench --device cuda --q-len 16384   # on a GPU"])
    add_case_args(p)
    p.add_argument("--bias", type=_bias, default=None, metavar="NAME",
                   help=f"a score modifier: {', '.join(BIAS_NAMES)} (suite: target 4; default: none)")
    p.add_argument("--compare", type=_compare, default=(), metavar="KINDS", help=COMPARE_HELP)
    p.add_argument("--backward", choices=["no", "yes", "both"], default="both", help="time the backward pass too")
    p.add_argument("--repeats", type=positive_int, default=5,
                   help="timed rounds per method (the median is shown); --roofline: rounds per path")
    p.add_argument("--backends", type=_backends, default=None, metavar="NAMES",
                   help=f"attnkit backends of the default table, comma-separated (default: {','.join(BACKENDS)})")
    p.add_argument("--backend", type=_backend, default=None, help="attnkit's backend with --compare (default: auto)")
    p.add_argument("--goal", type=positive_float, default=None,
                   help="largest allowed time ratio vs the first comparison")
    p.add_argument("--memory-goal", type=positive_float, default=None, help="largest allowed peak memory ratio")
    p.add_argument("--compile", action="store_true",
                   help="with --compare: attnkit's side under torch.compile(fullgraph=True) (compile time excluded); "
                        "compare compiled-sdpa-mask and attnkit-eager")
    p.add_argument("--ceiling", action="store_true", help="measure the matmul ceiling for GFLOP/s fractions")
    p.add_argument("--profile", action="store_true", help="top operators of attnkit's side for a missed goal")
    p.add_argument("--memory", action="store_true",
                   help="also measure peak memory in fresh processes (resident on cpu, the allocator's on cuda)")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--distributed", action="store_true",
                   help="sequence-parallel attention: every scheme x layout on --procs local gloo processes "
                        "(time per call, bytes sent measured and by formula; --q-len is the global length)")
    p.add_argument("--roofline", type=positive_int, nargs="*", default=None, metavar="L",
                   help="how close the window, block-sparse and dense paths run to the one-thread float32 matmul "
                        "ceiling at these lengths (default 4096 16384; --repeats rounds, --heads, --head-dim): "
                        "the ceiling section of BENCHMARKS.md")
    p.add_argument("--procs", type=positive_int, default=4, help="processes with --distributed")
    add_model_args(p)
    p.add_argument("--retain-memory", action="store_true",
                   help="keep freed memory for reuse (attnkit.runtime.retain_freed_memory); default: glibc's defaults")
    add_device_arg(p, "where the default table, --compare and --models run")
    p.set_defaults(func=_cmd_bench, option_defaults={dest: p.get_default(dest) for dest in SCOPE})
