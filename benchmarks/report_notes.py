"""The prose of the suite's BENCHMARKS.md section: how it measures, and per-target notes computed from the rows."""

from __future__ import annotations

import math
import statistics

from attnkit.lab.benchmarking.rows import Row, tolerance
from benchmarks.suite import ADDITIVE_BATCH

INTRO = [
    "Every ratio is attnkit's median time divided by the comparison's, both measured in this run on the same "
    "inputs and **interleaved** (one call of each side per round, the order reversed every other round, so load "
    "changes on this shared machine hit both sides). Times are medians (min-max) in ms over `runs` timed rounds "
    "after one warm-up round; a row whose round is slow gets fewer rounds than asked (its `runs`).",
    "",
    "- What a comparison needs once (SDPA's dense bool mask, the dense float bias, FlexAttention's block mask "
    "and its `torch.compile`) is built before timing; FlexAttention's compile and block-mask times are in the "
    "notes. Both sides run with glibc's default allocator settings, as a user's process does. "
    "`--retain-memory` turns `attnkit.runtime.retain_freed_memory()` on for the whole run. Measured "
    "separately on this machine (2 threads, L = 4096): it cut plain torch's soft-capped dense scores, "
    "forward+backward, from 3386 to 1563 ms (page faults), and slowed attnkit's slab kernels on repeated "
    "calls in one process (BigBird layout, forward: 0.15-0.16x of SDPA with the dense mask without it, "
    "0.18x on a first call and 0.25-0.26x later with it).",
    f"- max abs diff: between the two sides' outputs and, for fwd+bwd, every input gradient (upstream gradient "
    f"all ones). Above {tolerance('float32'):g} (float32) or {tolerance('bfloat16'):g} (bfloat16) times "
    "max(1, largest reference value) the row is **WRONG**. A comparison marked 'throughput reference' computes "
    "another function (SDPA without the bias) and is not checked.",
    "- GFLOP/s: the useful work of the pattern, whatever a kernel computes: forward 2(D + Dv) = 4D flops per "
    "allowed (query, key) pair, 4·B·H·Lq·Lk_active·D; forward+backward 3x that (the backward's four matmuls "
    "dV, dP, dQ, dK; FlashAttention's 2.5x-backward convention also counts recomputed scores: 3.5x). Additive "
    "rows count their projections, the hidden layer (4 flops per element) and weights @ values. The "
    "percentage is of the matmul ceiling measured at the run's thread count, in the row's dtype.",
    "- Memory (where shown): the peak resident memory one call adds, in a fresh child process; the inputs are "
    "excluded, a dense mask or bias the method needs is included.",
    "- Result: **PASS**/**MISS** against the target, — no target (context), n/a the comparison could not run "
    "(reason in the notes), **WRONG** the outputs differ.",
    "- Every row is reproduced by `attnkit bench --compare <kind>` with the sizes shown, e.g. "
    "`attnkit bench --compare sdpa-mask,flex --mask \"sliding_window(128, 128)\" --q-len 4096 --backward no`.",
]


def _exponent(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log value against log L."""
    pts = [(math.log(x), math.log(y)) for x, y in points if y and y > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    mx, my = statistics.fmean(x for x, _ in pts), statistics.fmean(y for _, y in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def _alibi_memory(rows: list[Row]) -> list[str]:
    mine = [r for r in rows if r.target == 4 and r.label == "alibi" and r.pass_ == "fwd+bwd" and r.ours_mem]
    ours = _exponent(sorted({(r.length, r.ours_mem) for r in mine}))
    theirs = _exponent(sorted({(r.length, r.theirs_mem) for r in mine if r.theirs.endswith("float bias)")}))
    if ours is None:
        return []
    verdict = "**PASS**" if ours <= 1.15 else "**MISS**"
    dense = "" if theirs is None else f"; SDPA with the dense float bias: L^{theirs:.2f}"
    return [f"Peak memory of attnkit with ALiBi (forward+backward) grows as L^{ours:.2f} over "
            f"L = {', '.join(str(n) for n in sorted({r.length for r in mine}))}"
            f" (target O(L), exponent ≤ 1.15: {verdict}){dense}. Soft-capping is not an additive bias: its "
            "comparison is plain torch with dense scores."]


def _bf16(info: dict, ceil: dict) -> list[str]:
    f32, b16 = ceil["float32"]["all"], ceil["bfloat16"]["all"]
    amx = [f for f in info.get("flags", []) if f.startswith("amx") or f == "avx512_bf16"]
    fast = b16 > 1.5 * f32
    lines = [f"AMX / AVX-512-BF16 flags on this CPU: {', '.join(amx) or 'none'} (torch CPU capability "
             f"{info['torch_cpu_capability']}). bf16 matmul ceiling {b16:.1f} GFLOP/s = {b16 / f32:.2f}x float32's "
             f"{f32:.1f}: bf16 matmuls {'take a fast (AMX) path' if fast else 'have no fast path on this machine'}. "
             "SDPA's fused CPU kernel converts blocks itself in the forward, so its bf16 forward does not follow "
             "the bf16 matmul, but its backward does; percentages above 100% mean faster than the bf16 matmul "
             "ceiling."]
    if not fast:
        lines += ["", "Without bf16 matmul units, attnkit's fused kernels compute bf16 inputs in float32 and round "
                  "the output once (`attnkit.runtime.low_precision_math`; `set_low_precision_math(\"native\")` "
                  "restores torch's bf16 path). Its bf16 rows are then float32 arithmetic plus the casts, so "
                  "'faster than its own float32' cannot hold on this machine: that part of the target needs "
                  "AMX or AVX-512-BF16 hardware, where the default computes natively."]
    return lines


def _additive() -> list[str]:
    gib = 32 * 512 * 512 * 256 * 4 / 2**30
    return [f"Run at B = {ADDITIVE_BATCH}, not B = 32: the broadcast version's (B, Lq, Lk, hidden) "
            f"float32 tensor is {gib:.0f} GiB at B = 32 and autograd keeps more than one of them, beyond what this "
            "shared machine can spare; both sides' time and memory grow linearly in B."]


def _ceiling_summary(rows: list[Row], ceil: dict) -> list[str]:
    lines = [f"Ceiling (this run's threads): float32 {ceil['float32']['all']:.1f} GFLOP/s, bfloat16 "
             f"{ceil['bfloat16']['all']:.1f} GFLOP/s; every table above shows attnkit's achieved GFLOP/s and "
             "its fraction of the ceiling. Per target (attnkit's side, each row counted once):", "",
             "| target | rows | median of ceiling | best | worst |", "|---|---|---|---|---|"]
    for target in sorted({r.target for r in rows}):
        seen = {(r.label, r.pass_, r.sizes): r.ceiling_frac for r in rows if r.target == target and r.ceiling_frac}
        if seen:
            fr = list(seen.values())
            lines.append(f"| {target} | {len(fr)} | {100 * statistics.median(fr):.0f}% | {100 * max(fr):.0f}% | "
                         f"{100 * min(fr):.0f}% |")
    return lines


def extras(rows: list[Row], info: dict, ceil: dict) -> dict[int, list[str]]:
    """Lines shown under each target's table."""
    return {3: ["ratio / density: attnkit's time relative to SDPA's dense time, per unit of block density; "
                "about 1 or less means attnkit's time is proportional to the non-empty blocks. The target "
                "applies to layouts near 10% density; the strided pattern (l = sqrt(L)) has a key in every "
                "block of the causal half, so it is reported without one.",
                "",
                "attnkit's block-sparse kernel builds a mask's block layout and the per-slab bias of its partial "
                "blocks on the first call and keeps them on the mask (the warm-up round here), as SDPA's dense "
                "mask is built once before timing."],
            4: _alibi_memory(rows), 5: _bf16(info, ceil), 6: _additive(), 7: _ceiling_summary(rows, ceil)}
