"""``attnkit`` command line: list, explain, bench (also ``python -m attnkit``)."""

from __future__ import annotations

import argparse
import sys

import torch

from . import registry
from .analysis.bench import Case, peak_memory, run_case
from .attention import explain
from .functional.mask_parse import parse
from .runtime import retain_freed_memory


def _cmd_list(args) -> int:
    rows = [e for e in registry.entries() if args.family in (None, e.family)]
    if not rows:
        families = sorted({e.family for e in registry.entries()})
        raise ValueError(f"no mechanism in family {args.family!r}; families: {', '.join(families)}")
    name_w, fam_w, cx_w = (max(len(getattr(e, a)) for e in rows) for a in ("name", "family", "complexity"))
    print(f"{'name':<{name_w}}  {'family':<{fam_w}}  {'complexity':<{cx_w}}  paper")
    for e in rows:
        print(f"{e.name:<{name_w}}  {e.family:<{fam_w}}  {e.complexity:<{cx_w}}  {e.paper}")
    print(f"\n{len(rows)} mechanisms")
    return 0


def _add_case_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--q-len", type=int, default=4096)
    p.add_argument("--kv-len", type=int, default=None, help="default: q-len")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "bfloat16", "float16"])
    p.add_argument("--mask", default=None, help='e.g. "causal() & sliding_window(128, 128)"')


def _case(args, backward=False) -> Case:
    return Case(args.batch, args.heads, args.q_len, args.kv_len, args.head_dim, args.dtype, args.mask, backward)


def _cmd_explain(args) -> int:
    q, k, v = _case(args).inputs()
    print(f"attention(q{tuple(q.shape)}, k{tuple(k.shape)}, v{tuple(v.shape)}, mask={args.mask or None})")
    print(explain(q, k, v, mask=parse(args.mask) if args.mask else None))
    return 0


def _progress(total: int):
    try:
        from tqdm import tqdm
    except ImportError:  # the cli extra is optional: fall back to plain lines
        return lambda name: print(f"  timing {name} ...", file=sys.stderr)
    bar = tqdm(total=total, desc="bench", file=sys.stderr, leave=False)

    def step(name):
        bar.set_postfix_str(name)
        bar.update(1)
    return step


def _cmd_bench(args) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.no_retain_memory:
        retain_freed_memory()
    backends = tuple(args.backends.split(","))
    for backward in ([False, True] if args.backward == "both" else [args.backward == "yes"]):
        case = _case(args, backward)
        rows = run_case(case, repeats=args.repeats, backends=backends, progress=_progress(len(backends) + 2))
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnkit", description="attention mechanisms on one exact, fast core")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="every registered mechanism with its paper and complexity")
    p.add_argument("--family", default=None)
    p.set_defaults(func=_cmd_list)
    p = sub.add_parser("explain", help="which backend attnkit.attention picks for given sizes, and why")
    _add_case_args(p)
    p.set_defaults(func=_cmd_explain)
    p = sub.add_parser("bench", help="time attnkit's backends against torch SDPA on the same inputs")
    _add_case_args(p)
    p.add_argument("--backward", choices=["no", "yes", "both"], default="both")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--backends", default="auto,blocksparse,chunked,sdpa")
    p.add_argument("--memory", action="store_true", help="also measure peak memory in fresh processes")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-retain-memory", action="store_true", help="leave glibc's default of unmapping freed memory")
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError) as err:
        print(f"attnkit: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
