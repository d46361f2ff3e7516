"""Core engine benchmarks (issue 2), written into BENCHMARKS.md between ``<!-- core:start/end -->``.

Every time is a median of ``--repeats`` runs measured in this one process, side by
side with torch SDPA on the same inputs; every memory number is the peak resident
memory one call adds, measured in a fresh child process. Usage::

    python benchmarks/core.py                 # writes BENCHMARKS.md
    python benchmarks/core.py --quick --print  # smaller, prints only
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path

import torch

from attnkit.analysis.bench import Case, methods, peak_memory, run_case, time_call, with_backward
from attnkit.masks import parse
from attnkit.runtime import retain_freed_memory

WINDOW = "sliding_window(128, 128)"


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _timing_table(case: Case, repeats: int, backends) -> list[str]:
    rows = run_case(case, repeats=repeats, backends=backends)
    base = next(r for r in rows if r.method.startswith("torch sdpa (dense")) if case.mask else rows[0]
    lines = [f"| method | median ms | min-max ms | time / ({base.method}) | speed-up | max abs diff vs it |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        diff = (r.output.float() - base.output.float()).abs().max().item()
        lines.append(f"| {r.method} | {r.median_s * 1e3:.1f} | {r.min_s * 1e3:.1f}-{r.max_s * 1e3:.1f} | "
                     f"{r.median_s / base.median_s:.3f} | {base.median_s / r.median_s:.2f}x | {diff:.1e} |")
    return lines


def _window_section(length: int, repeats: int) -> list[str]:
    out = []
    for retain in (False, True):
        if retain:
            retain_freed_memory()
        label = "glibc keeps freed memory (attnkit.runtime.retain_freed_memory)" if retain else "glibc defaults"
        for backward in (False, True):
            case = Case(batch=1, heads=8, q_len=length, head_dim=64, mask=WINDOW, backward=backward)
            out += [f"\n**{'forward+backward' if backward else 'forward'}, {label}**\n"]
            out += _timing_table(case, repeats, ("auto", "blocksparse", "chunked"))
    return out


def _memory_section(lengths, dense_lengths) -> list[str]:
    out = ["| L | attnkit blocksparse (MiB) | MiB per 1k tokens | torch sdpa, dense bool mask (MiB) |",
           "|---|---|---|---|"]
    for length in lengths:
        case = Case(batch=1, heads=8, q_len=length, head_dim=64, mask=WINDOW, backward=True)
        mib = peak_memory(case, "attnkit blocksparse", ("blocksparse",)) / 2**20
        dense = (f"{peak_memory(case, 'torch sdpa (dense bool mask)', ()) / 2**20:.0f}"
                 if length in dense_lengths else "not run (L^2 mask)")
        out.append(f"| {length} | {mib:.0f} | {mib / (length / 1024):.1f} | {dense} |")
    return out


def _long_dense_section(length: int) -> list[str]:
    case = Case(batch=1, heads=1, q_len=length, head_dim=64, backward=True)
    start = time.perf_counter()
    mib = peak_memory(case, "attnkit chunked", ("chunked",)) / 2**20
    seconds = time.perf_counter() - start
    return [f"Dense attention, B=1, H=1, D=64, L={length}, forward+backward on the chunked backend: "
            f"peak extra memory **{mib:.0f} MiB** (wall time of the child process {seconds:.0f} s); "
            f"the dense score matrix alone would be {length * length * 4 / 2**30:.0f} GiB."]


def _sdpa_equivalent(mask_text, q, k, v):
    """What a torch user writes for the same mask: no mask, ``is_causal``, or a (B, 1, 1, L) key mask."""
    import torch.nn.functional as F
    if mask_text is None:
        return lambda: F.scaled_dot_product_attention(q, k, v)
    if mask_text == "causal()":
        return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    keep = parse(mask_text).materialize(1, k.shape[2], batch=q.shape[0])  # (B, 1, 1, Lk)
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


def _dense_ratio_section(lengths, repeats) -> list[str]:
    out = ["| L | mask | pass | torch sdpa ms | attnkit auto ms | attnkit / sdpa | max abs diff |",
           "|---|---|---|---|---|---|---|"]
    for length in lengths:
        for mask in (None, "causal()", f"padding([{length * 3 // 4}])"):
            for backward in (False, True):
                case = Case(batch=1, heads=8, q_len=length, head_dim=64, mask=mask, backward=backward)
                q, k, v = case.inputs()
                ours = methods(case, q, k, v, ("auto",))
                ours = next(fn for name, fn in ours.items() if name.startswith("attnkit auto"))
                theirs = _sdpa_equivalent(mask, q, k, v)
                t_ours, t_theirs = (time_call(with_backward(fn, (q, k, v)) if backward else fn, repeats)[0]
                                    for fn in (ours, theirs))
                diff = (ours() - theirs()).abs().max().item()
                out.append(f"| {length} | {mask or 'none'} | {'fwd+bwd' if backward else 'fwd'} | "
                           f"{t_theirs * 1e3:.2f} | {t_ours * 1e3:.2f} | {t_ours / t_theirs:.3f} | {diff:.1e} |")
    return out


def build(args) -> str:
    lines = [
        "<!-- core:start -->",
        "## Core engine (issue 2)",
        "",
        f"Command: `python benchmarks/core.py {' '.join(sys.argv[1:])}`, run {datetime.date.today()}; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {_cpu_name()}, "
        f"Python {platform.python_version()}.",
        "Times are medians in one process; memory is the peak one call adds, in a fresh child process.",
        "",
        f"### Sliding window (left = right = 128), B=1, H=8, D=64, float32, L={args.window_length}",
        *_window_section(args.window_length, args.repeats),
        "",
        "### Peak memory of the block-sparse backend grows linearly in L (same window, forward+backward)",
        "",
        *_memory_section(args.memory_lengths, args.dense_memory_lengths),
        "",
        "### Long dense attention in bounded memory",
        "",
        *_long_dense_section(args.long_length),
        "",
        "### Dense, causal and padding masks: attnkit.attention (auto) against torch SDPA",
        "",
        "The padding row compares with SDPA given the (B, 1, 1, L) bool key mask a user would pass.",
        "",
        *_dense_ratio_section(args.ratio_lengths, args.repeats),
        "<!-- core:end -->",
    ]
    return "\n".join(lines) + "\n"


def write_section(path: Path, text: str, start: str = "<!-- core:start -->", end: str = "<!-- core:end -->"):
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    if start in old and end in old:
        head, rest = old.split(start, 1)
        new = head + text.strip() + rest.split(end, 1)[1]
    else:
        new = old.rstrip() + "\n\n" + text
    path.write_text(new)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--print", action="store_true", help="print instead of writing BENCHMARKS.md")
    parser.add_argument("--out", default="BENCHMARKS.md")
    args = parser.parse_args()
    big = not args.quick
    args.window_length = 4096 if big else 512
    args.memory_lengths = (4096, 16384, 65536) if big else (512, 1024)
    args.dense_memory_lengths = (4096, 16384) if big else (512,)
    args.long_length = 65536 if big else 4096
    args.ratio_lengths = (128, 1024, 4096) if big else (128,)
    text = build(args)
    if args.print:
        print(text)
    else:
        write_section(Path(args.out), text)
        print(text)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
