"""How close each execution path runs to the machine's one-thread float32 matmul ceiling (``attnkit bench --roofline``).

The ceiling is the best GFLOP/s of large float32 matmuls at 1 thread, measured on the
shapes the kernels multiply (:func:`attnkit.lab.benchmarking.machine.attention_products`: a
square ``mm`` and the two batched products of a block of queries against a window of
keys). For each path (``band-windows`` on a sliding window, ``blocksparse-fused`` on a
BigBird layout, ``torch-sdpa`` and ``dense-reference`` without a mask) and length, each
round times the ceiling's products (best of 3 calls each) and one call of the path,
interleaved (:func:`attnkit.lab.benchmarking.machine.matmul_rounds`); the row's fraction is, per round,
the path's FLOPs over its time divided by that round's ceiling (median and range over
the rounds). The path's FLOPs are its own ``cost(p, grad)``
(:mod:`attnkit.kernels.path_cost`), counted for the backward as ``attnkit.costing.analytic``
counts them: the work the path computes, padding lanes of its blocks included.

What bounds the rest comes from one profiled call (``torch.profiler``, self CPU time of
every operator, grouped): matmuls, torch's fused attention kernel (its matmuls, softmax
and masking in cache-sized tiles), softmax and exp, gathers and copies (``index_select``,
``index_add_``, ``copy_``, fills), masking, other elementwise work, and the wall time no
operator accounts for (Python, dispatch, validation).
"""

from __future__ import annotations

import datetime
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ...core import attention, explain
from ...costing.attend import _kernel
from ...costing.tally import Tally
from ..analysis.patterns import make_mask
from ..analysis.timing import time_once
from .machine import attention_products, matmul_rounds
from .profiling import profiled

__all__ = ["Config", "Row", "useful_flops", "bounds", "rows_for", "measure", "table", "run", "report"]


@dataclass(frozen=True)
class Config:
    """The problem sizes and patterns of the section (the defaults are BENCHMARKS.md's)."""

    lengths: tuple[int, ...] = (4096, 16384)
    heads: int = 8
    head_dim: int = 64
    window: str = "sliding_window(128, 128)"
    sparse: str = "bigbird(64, 3, 1, 2)"
    rounds: int = 5
    reference_max: int = 4096  # dense-reference holds H * L^2 scores: 8.6 GB at L = 16384
    dense_backward_max: int = 4096  # one SDPA forward+backward at L = 16384 takes over a minute at 1 thread
    budget_s: float = 60.0  # per row: fewer rounds when one is slow (at least 2)
    ceiling_n: int = 1024


@dataclass
class Row:
    path: str
    backend: str
    mask: str | None
    length: int
    backward: bool
    flops: float = 0.0
    times: list[float] = field(default_factory=list)
    fractions: list[float] = field(default_factory=list)
    ceilings: list[float] = field(default_factory=list)
    bounds: dict[str, float] = field(default_factory=dict)
    skipped: str | None = None


def useful_flops(decision, backward: bool) -> float:
    """The path's FLOPs from its own ``cost()``, the backward counted as ``attnkit.costing.analytic`` counts it."""
    tally = Tally(backward=backward)
    _kernel(tally, "", decision.cost, (backward, 2, 2), pairwise=True)
    return float(sum(tally.terms.values()))


def _call(row: Row, cfg: Config):
    """``(call, decision)``: one timed call of the row's path, and the dispatcher's decision for it."""
    g = torch.Generator().manual_seed(0)
    shape = (1, cfg.heads, row.length, cfg.head_dim)
    q, k, v = (torch.randn(shape, generator=g).requires_grad_(row.backward) for _ in range(3))
    mask = make_mask(row.mask, row.length)
    decision = explain(q, k, v, mask=mask, backend=row.backend)

    def forward():
        with torch.no_grad():
            return attention(q, k, v, mask=mask, backend=row.backend)

    def forward_backward():
        attention(q, k, v, mask=mask, backend=row.backend).sum().backward()
        for t in (q, k, v):
            t.grad = None

    return (forward_backward if row.backward else forward), decision


_GROUPS = (
    ("fused attention kernel", ("flash_attention",)),
    ("matmul", ("bmm", "aten::mm", "matmul", "addmm", "baddbmm")),
    ("softmax, exp", ("softmax", "exp", "log")),
    ("gathers, copies, fills", ("index_select", "index_add", "copy_", "fill_", "zero_", "cat", "gather", "scatter",
                                "clone", "empty", "zeros", "as_strided_scatter")),
    ("masking", ("masked_fill", "where", "isneginf")),
)


def _group(op: str) -> str | None:
    return next((name for name, keys in _GROUPS if any(key in op for key in keys)), None)


def bounds(fn: Callable[[], object], backward: bool) -> dict[str, float]:
    """Share of one profiled call's wall time per group of operators (self CPU time); the rest: Python, dispatch."""
    with torch.set_grad_enabled(backward), profiled() as prof:
        wall, _ = time_once(fn)  # the profiled call's own wall time: a busy machine changes it from call to call
    shares: dict[str, float] = {}
    for event in prof.key_averages():
        if event.self_cpu_time_total <= 0 or not event.key.startswith("aten::"):
            continue
        name = _group(event.key) or "other elementwise"
        shares[name] = shares.get(name, 0.0) + event.self_cpu_time_total / 1e6
    ops = sum(shares.values())
    scale = min(1.0, wall / ops) if ops else 1.0  # operator times can add up past the wall time by rounding
    out = {name: t * scale / wall for name, t in shares.items()}
    out["Python, dispatch (no operator)"] = max(0.0, 1.0 - ops * scale / wall)
    return out


def rows_for(cfg: Config) -> list[Row]:
    rows = []
    for length in cfg.lengths:
        for backward in (False, True):
            for path, backend, mask in (("band-windows", "blocksparse", cfg.window),
                                        ("blocksparse-fused", "blocksparse", cfg.sparse),
                                        ("torch-sdpa", "sdpa", None), ("dense-reference", "reference", None)):
                row = Row(path, backend, mask, length, backward)
                if path == "dense-reference" and length > cfg.reference_max:
                    row.skipped = f"skipped: dense scores of {cfg.heads * length ** 2 * 4 / 2 ** 30:.1f} GiB"
                elif path == "torch-sdpa" and backward and length > cfg.dense_backward_max:
                    row.skipped = "skipped: over a minute per call at 1 thread"
                rows.append(row)
    return rows


def measure(row: Row, cfg: Config, products) -> Row:
    """Interleaved rounds of the ceiling's products and one call of the row's path; then one profiled call."""
    fn, decision = _call(row, cfg)
    if decision.path != row.path:  # the dispatcher's rules at these sizes: reported, not measured
        row.skipped = f"skipped: {row.backend} runs {decision.path} here"
        return row
    row.flops = useful_flops(decision, row.backward)
    once, _ = time_once(fn)  # warm-up: layouts and plans cached on the mask, the allocator
    rounds = max(2, min(cfg.rounds, int(cfg.budget_s / max(once, 1e-9))))
    rates, beside = matmul_rounds(products, rounds, warmup=0, best_of=3, beside={"path": fn})
    row.times = beside["path"]
    row.ceilings = [max(round_rates) for round_rates in zip(*rates.values(), strict=True)]
    row.fractions = [row.flops / t / 1e9 / c for t, c in zip(row.times, row.ceilings, strict=True)]
    row.bounds = bounds(fn, row.backward)
    return row


def _rest(bounds_: dict[str, float]) -> str:
    parts = sorted(bounds_.items(), key=lambda kv: -kv[1])
    return "; ".join(f"{name} {share:.0%}" for name, share in parts if share >= 0.02)


def table(rows: list[Row]) -> str:
    lines = ["| path | mask | L | pass | ms (min-max) | GFLOP/s (cost()) | ceiling GFLOP/s | fraction (min-max) | "
             "where the time goes (one profiled call) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = f"| {r.path} | {r.mask or 'none'} | {r.length} | {'fwd+bwd' if r.backward else 'fwd'} |"
        if r.skipped:
            lines.append(f"{head} — | — | — | {r.skipped} | |")
            continue
        ms = [t * 1e3 for t in r.times]
        rate = r.flops / statistics.median(r.times) / 1e9
        lines.append(f"{head} {statistics.median(ms):.1f} ({min(ms):.1f}-{max(ms):.1f}) | {rate:.1f} | "
                     f"{statistics.median(r.ceilings):.1f} | {statistics.median(r.fractions):.0%} "
                     f"({min(r.fractions):.0%}-{max(r.fractions):.0%}) | {_rest(r.bounds)} |")
    return "\n".join(lines)


def run(cfg: Config, log=print) -> tuple[list[Row], dict[str, float]]:
    """Every row of the section at 1 thread, and the ceiling's products measured alone (GFLOP/s, best of 5)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        products = attention_products(cfg.head_dim, cfg.ceiling_n)
        alone = {name: max(rates) for name, rates in matmul_rounds(products, 5)[0].items()}
        rows = []
        for row in rows_for(cfg):
            rows.append(row if row.skipped else measure(row, cfg, products))
            if not row.skipped:
                log(f"{row.path} L={row.length} {'fwd+bwd' if row.backward else 'fwd'}: "
                    f"{statistics.median(row.fractions):.0%} of the ceiling")
    finally:
        torch.set_num_threads(before)
    return rows, alone


def report(cfg: Config, rows: list[Row], alone: dict[str, float], command: str, notes: str = "") -> str:
    ceiling = "; ".join(f"{name}: {rate:.1f}" for name, rate in alone.items())
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"`{command}`, run {when} (torch {torch.__version__}, 1 thread, B=1 H={cfg.heads} D={cfg.head_dim} "
            "float32)\n\n"
            f"Ceiling products measured alone (GFLOP/s, best of 5): {ceiling}. Each row's ceiling is the best of "
            "them, measured again in every round beside the path's call.\n\n" + table(rows))
    return text + ("\n\n" + notes if notes else "")
