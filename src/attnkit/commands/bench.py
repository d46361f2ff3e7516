"""``attnkit bench``: time attnkit's backends against torch SDPA on the same inputs."""

from __future__ import annotations

import torch

from ..analysis.bench import peak_memory, run_case
from ..runtime import retain_freed_memory
from .inspect import add_case_args, case_from_args
from .progress import progress


def _cmd_bench(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.no_retain_memory:
        retain_freed_memory()
    backends = tuple(args.backends.split(","))
    for backward in ([False, True] if args.backward == "both" else [args.backward == "yes"]):
        case = case_from_args(args, backward)
        rows = run_case(case, repeats=args.repeats, backends=backends,
                        progress=progress(len(backends) + 2, "bench"))
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
    return 0


def add(sub) -> None:
    p = sub.add_parser("bench", help="time attnkit's backends against torch SDPA on the same inputs")
    add_case_args(p)
    p.add_argument("--backward", choices=["no", "yes", "both"], default="both")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--backends", default="auto,blocksparse,chunked,sdpa")
    p.add_argument("--memory", action="store_true", help="also measure peak memory in fresh processes")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-retain-memory", action="store_true", help="leave glibc's default of unmapping freed memory")
    p.set_defaults(func=_cmd_bench)
