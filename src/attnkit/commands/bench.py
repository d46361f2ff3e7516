"""``attnkit bench``: time attnkit against torch on the same inputs; any row of the benchmark suite.

Without ``--compare`` it times attnkit's backends side by side with torch SDPA
(:mod:`attnkit.analysis.timing`). With ``--compare KIND[,KIND...]`` it runs the suite's
own row code (``benchmarks.harness.rows.run_spec``) for the given sizes: attnkit and
each comparison interleaved, max |diff| of every pair, GFLOP/s, optional memory. The
harness lives in ``benchmarks/harness/`` of the source tree, not in the installed
package, so ``--compare`` needs a source checkout (an editable install finds it).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from pathlib import Path

from ..errors import ArgumentError, did_you_mean
from ..progress import progress
from .bench_models import add_model_args
from .common import add_command, positive_float, positive_int
from .inspect import add_case_args, case_from_args

BIAS_NAMES = ("alibi", "relpos", "softcap")  # attnkit.analysis.patterns.BIASES, which imports torch (a test checks)

DESCRIPTION = """\
Time attnkit against torch on the same inputs, or run any row of the benchmark suite.

Without --compare: attnkit's backends side by side with torch SDPA (no mask, and the
dense bool mask a torch user would build), medians of --repeats runs, and the max abs
difference of each output from SDPA's. With --compare KIND[,KIND...]: the suite's own
row code for these sizes (attnkit and each comparison interleaved, max |diff| of every
pair, GFLOP/s, optional memory); that code lives in benchmarks/harness/ of the source
tree, so --compare needs a source checkout (pip install -e .)."""

COMPARE_HELP = ("backends (default): attnkit's backends and SDPA; or comma-separated suite comparisons: "
                "sdpa (SDPA as called for the mask: no mask, is_causal, key mask), sdpa-mask (dense bool mask), "
                "sdpa-bias (dense float bias), eager (plain torch), flex (compiled FlexAttention), fp32 "
                "(attnkit in float32; for --dtype bfloat16), compiled-sdpa-mask (sdpa-mask under torch.compile), "
                "attnkit-eager (attnkit not compiled; with --compile), "
                "additive (AdditiveAttention vs broadcast-then-tanh: "
                "--batch, --q-len, --kv-len and --head-dim as the width)")


ROOT = Path(__file__).resolve().parents[3]  # a source checkout: src/attnkit/commands/bench.py -> the repository


def source_module(name: str):
    """``benchmarks.<name>`` of the source checkout this attnkit runs from; LookupError if there is none."""
    if not (ROOT / "benchmarks" / "harness" / "__init__.py").is_file():
        raise LookupError("--compare and --models run the benchmark suite's code (benchmarks/harness/, "
                          "benchmarks/whole_models.py), which is not part of the installed package: run it from a "
                          "source checkout of attnkit (pip install -e .)")
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"benchmarks.{name}")


def harness(name: str):
    """``benchmarks.harness.<name>`` of the source checkout (see :func:`source_module`)."""
    return source_module(f"harness.{name}")


def _compare(text: str) -> tuple[str, ...]:
    if text == "backends":
        return ()
    try:
        kinds_known = harness("methods").KINDS
    except LookupError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    known = ("backends", "additive", *kinds_known)
    bad = [k for k in kinds if k not in known]
    if not kinds or bad:
        hint = did_you_mean(bad[0], known) if bad else ""
        raise argparse.ArgumentTypeError(f"unknown comparison {', '.join(map(repr, bad)) or repr(text)}; {hint}"
                                         f"use backends, additive, or any of {', '.join(kinds_known)}")
    if "additive" in kinds and len(kinds) > 1:
        raise argparse.ArgumentTypeError("additive is compared alone (it is another module, not attention())")
    return kinds


def _case(args, backward: bool):
    return dataclasses.replace(case_from_args(args, backward), bias=args.bias)


def _bias(text: str) -> str:
    if text not in BIAS_NAMES:
        raise argparse.ArgumentTypeError(f"unknown bias {text!r}; {did_you_mean(text, BIAS_NAMES)}"
                                         f"biases: {', '.join(BIAS_NAMES)}")
    return text


def _backends(text: str) -> tuple[str, ...]:
    """``--backends``: attnkit backends, comma-separated (did-you-mean for a typo)."""
    from ..kernels.paths import BACKENDS

    names = tuple(b.strip() for b in text.split(",") if b.strip())
    for name in names:
        if name not in BACKENDS:
            raise ArgumentError(f"--backends: unknown backend {name!r}; {did_you_mean(name, BACKENDS)}"
                                f"backends: {', '.join(BACKENDS)}")
    return names


def _backends_table(args, backward: bool) -> None:
    from ..analysis.timing import peak_memory, run_case

    backends = _backends(args.backends)
    case = _case(args, backward)
    rows = run_case(case, repeats=args.repeats, backends=backends, progress=progress(len(backends) + 2, "bench"))
    base = next((r for r in rows if r.method == "torch sdpa (dense bool mask)"), rows[0])
    print(f"\n{'forward+backward' if backward else 'forward'}: {case}")
    print("| method | median ms | min-max ms | time vs " + base.method + " | max abs diff |")
    print("|---|---|---|---|---|")
    for r in rows:
        diff = (r.output.float() - base.output.float()).abs().max().item()
        print(f"| {r.method} | {r.median_s * 1e3:.1f} | {r.min_s * 1e3:.1f}-{r.max_s * 1e3:.1f} | "
              f"{r.median_s / base.median_s:.3f}x | {diff:.2e} |")
    if args.memory:
        print("\n| method | peak extra memory MiB (fresh process) |\n|---|---|")
        for r in rows:
            print(f"| {r.method} | {peak_memory(case, r.method, backends) / 2**20:.1f} |")


def _suite_rows(args, backward: bool) -> None:
    if len(_backends(args.backend)) != 1:
        raise ArgumentError(f"--backend: one attnkit backend with --compare; got {args.backend!r}")
    ceiling = harness("machine").ceiling
    misses, rows_table = harness("report").misses, harness("report").rows_table
    Spec, run_spec = harness("rows").Spec, harness("rows").run_spec

    case = _case(args, backward)
    label = "additive" if args.compare == ("additive",) else args.mask or args.bias or "no mask"
    spec = Spec(0, label, case, args.compare, (args.goal,) if args.goal is not None else (), args.repeats,
                memory=args.memory, mem_goal=args.memory_goal, backend=args.backend, compiled=args.compile)
    peak = {k: v["all"] for k, v in ceiling(seconds=0.5).items()} if args.ceiling else None
    steps = 3 + bool(args.memory) + bool(args.profile)
    rows = run_spec(spec, ceiling=peak, progress=progress(steps, "bench"), profile_misses=args.profile)
    print(f"\n{'forward+backward' if backward else 'forward'}:")
    print("\n".join(rows_table(rows)))
    if any(r.verdict in ("MISS", "WRONG") for r in rows):
        print("\n" + "\n".join(misses(rows)))


def _roofline(args) -> int:
    """The ceiling section of BENCHMARKS.md (``benchmarks/ceiling.py``) for the given lengths and sizes."""
    try:
        harness("machine")  # a source checkout: puts it on sys.path
    except LookupError as err:
        raise ArgumentError(str(err).replace("--compare", "--roofline")) from None
    ceiling = importlib.import_module("benchmarks.ceiling")
    lengths = tuple(args.roofline) or ceiling.Config.lengths
    cfg = ceiling.Config(lengths=lengths, heads=args.heads, head_dim=args.head_dim, rounds=args.repeats)
    rows, alone = ceiling.run(cfg, log=lambda line: print(line, file=sys.stderr))
    command = f"attnkit bench --roofline {' '.join(map(str, lengths))} --repeats {args.repeats}"
    print(ceiling.report(cfg, rows, alone, command))
    return 0


def _distributed(args) -> int:
    from ..distributed import bench as distributed_bench  # starts processes: imported only when asked

    for backward in ([False, True] if args.backward == "both" else [args.backward == "yes"]):
        spec = distributed_bench.Spec(procs=args.procs, batch=args.batch, heads=args.heads, length=args.q_len,
                                      head_dim=args.head_dim, dtype=args.dtype, mask=args.mask, backward=backward,
                                      repeats=args.repeats, threads=args.threads or 1)
        print("\n" + "\n".join(distributed_bench.rows_table(spec, distributed_bench.measure(spec))))
    return 0


def _cmd_bench(args) -> int:
    if args.distributed:
        return _distributed(args)
    if args.roofline is not None:
        return _roofline(args)
    if args.models:
        from .bench_models import run_models

        return run_models(args)
    import torch

    from ..runtime import retain_freed_memory

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.retain_memory:
        retain_freed_memory()
    for backward in ([False, True] if args.backward == "both" else [args.backward == "yes"]):
        (_suite_rows if args.compare else _backends_table)(args, backward)
    return 0


def add(sub) -> None:
    p = add_command(sub, "bench", summary="time attnkit against torch SDPA / FlexAttention on the same inputs",
                    description=DESCRIPTION,
                    examples=['attnkit bench --q-len 4096 --mask "sliding_window(128, 128)" --memory',
                              'attnkit bench --compare flex --q-len 4096 --mask "sliding_window(128, 128)"   '
                              '# a row of BENCHMARKS.md',
                              "attnkit bench --bias alibi --backward no --repeats 3",
                              "attnkit bench --roofline 4096   # fraction of the matmul ceiling per path",
                              "attnkit bench --models all --compiled   # the whole-model rows of BENCHMARKS.md"])
    add_case_args(p)
    p.add_argument("--bias", type=_bias, default=None, metavar="NAME",
                   help=f"a score modifier: {', '.join(BIAS_NAMES)} (suite: target 4; default: none)")
    p.add_argument("--compare", type=_compare, default=(), metavar="KINDS", help=COMPARE_HELP)
    p.add_argument("--backward", choices=["no", "yes", "both"], default="both", help="time the backward pass too")
    p.add_argument("--repeats", type=positive_int, default=5, help="timed runs per method (the median is shown)")
    p.add_argument("--backends", default="auto,blocksparse,chunked,sdpa", help="attnkit backends, without --compare")
    p.add_argument("--backend", default="auto", help="attnkit's backend with --compare")
    p.add_argument("--goal", type=positive_float, default=None,
                   help="largest allowed time ratio vs the first comparison")
    p.add_argument("--memory-goal", type=positive_float, default=None, help="largest allowed peak memory ratio")
    p.add_argument("--compile", action="store_true",
                   help="with --compare: attnkit's side under torch.compile(fullgraph=True) (compile time excluded); "
                        "compare compiled-sdpa-mask and attnkit-eager")
    p.add_argument("--ceiling", action="store_true", help="measure the matmul ceiling for GFLOP/s fractions")
    p.add_argument("--profile", action="store_true", help="top operators of attnkit's side for a missed goal")
    p.add_argument("--memory", action="store_true", help="also measure peak memory in fresh processes")
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
    p.set_defaults(func=_cmd_bench)
