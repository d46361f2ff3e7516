"""How close each execution path runs to the machine's one-thread float32 matmul ceiling.

The ceiling is the best GFLOP/s of large float32 matmuls at 1 thread, measured on the
shapes the kernels multiply (a square ``mm`` and the two batched products of a block of
queries against a window of keys, ``(n, 128, D) @ (n, D, 512)`` and ``(n, 128, 512) @
(n, 512, D)``). For each path (``band-windows`` on a sliding window, ``blocksparse-fused``
on a BigBird layout, ``torch-sdpa`` and ``dense-reference`` without a mask) and length, a
round times the ceiling's products and one call of the path, in alternating order; the
row's fraction is, per round, the path's FLOPs over its time divided by that round's
ceiling (median and range over the rounds). The path's FLOPs are its own
``cost(p, grad)`` (:mod:`attnkit.kernels.path_cost`), counted for the backward as
``attnkit.analysis.cost`` counts them: the work the path computes, padding lanes of its
blocks included.

What bounds the rest comes from one profiled call (``torch.profiler``, self CPU time of
every operator, grouped): matmuls, torch's fused attention kernel (its matmuls, softmax
and masking in cache-sized tiles), softmax and exp, gathers and copies (``index_select``,
``index_add_``, ``copy_``, fills), masking, other elementwise work, and the wall time no
operator accounts for (Python, dispatch, validation).

Usage: ``python benchmarks/ceiling.py [--lengths 4096 16384] [--rounds 5] [--write BENCHMARKS.md]``;
``attnkit bench --roofline`` runs the same.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

import attnkit
from attnkit.analysis.patterns import make_mask
from attnkit.costing.attend import _kernel
from attnkit.costing.tally import Tally

START, END = "<!-- ceiling:start -->", "<!-- ceiling:end -->"
TITLE = "How close each path runs to the matmul ceiling"


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


def ceiling_products(head_dim: int, n: int) -> dict[str, tuple[Callable[[], object], int]]:
    """The matmuls whose best rate is the ceiling: ``name -> (call, FLOPs per call)``."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    batch = max(1, (1 << 22) // (128 * 512))
    q, kt = torch.randn(batch, 128, head_dim, generator=g), torch.randn(batch, head_dim, 512, generator=g)
    s, v = torch.randn(batch, 128, 512, generator=g), torch.randn(batch, 512, head_dim, generator=g)
    return {f"mm {n}x{n}x{n}": (lambda: a @ b, 2 * n ** 3),
            f"bmm ({batch}, 128, {head_dim}) @ ({head_dim}, 512)": (lambda: torch.bmm(q, kt),
                                                                     2 * batch * 128 * head_dim * 512),
            f"bmm ({batch}, 128, 512) @ (512, {head_dim})": (lambda: torch.bmm(s, v),
                                                            2 * batch * 128 * 512 * head_dim)}


def measure_ceiling(products, calls: int = 3) -> dict[str, float]:
    """GFLOP/s of each product: the best of ``calls`` timed calls after one warm-up."""
    rates = {}
    for name, (fn, flops) in products.items():
        fn()
        best = min(_timed(fn) for _ in range(calls))
        rates[name] = flops / best / 1e9
    return rates


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def useful_flops(decision, backward: bool) -> float:
    """The path's FLOPs from its own ``cost()``, the backward counted as ``attnkit.analysis.cost`` counts it."""
    tally = Tally(backward=backward)
    _kernel(tally, "", decision.cost, (backward, 2, 2), pairwise=True)
    return float(sum(tally.terms.values()))


def _call(row: Row, cfg: Config):
    """``(call, decision)``: one timed call of the row's path, and the dispatcher's decision for it."""
    g = torch.Generator().manual_seed(0)
    shape = (1, cfg.heads, row.length, cfg.head_dim)
    q, k, v = (torch.randn(shape, generator=g).requires_grad_(row.backward) for _ in range(3))
    mask = make_mask(row.mask, row.length)
    decision = attnkit.explain(q, k, v, mask=mask, backend=row.backend)
    if decision.path != row.path:
        raise RuntimeError(f"{row.backend} runs {decision.path}, not {row.path}, on {row.mask} at L={row.length}")

    def forward():
        with torch.no_grad():
            return attnkit.attention(q, k, v, mask=mask, backend=row.backend)

    def forward_backward():
        attnkit.attention(q, k, v, mask=mask, backend=row.backend).sum().backward()
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
    from torch.profiler import ProfilerActivity, profile

    with torch.set_grad_enabled(backward), profile(activities=[ProfilerActivity.CPU]) as prof:
        wall = _timed(fn)  # the profiled call's own wall time: a busy machine changes it from call to call
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
    row.flops = useful_flops(decision, row.backward)
    start = time.perf_counter()
    fn()  # warm-up: layouts and plans cached on the mask, the allocator
    rounds = max(2, min(cfg.rounds, int(cfg.budget_s / max(time.perf_counter() - start, 1e-9))))
    for r in range(rounds):
        if r % 2:
            t, ceiling = _timed(fn), max(measure_ceiling(products).values())
        else:
            ceiling, t = max(measure_ceiling(products).values()), _timed(fn)
        row.times.append(t)
        row.ceilings.append(ceiling)
        row.fractions.append(row.flops / t / 1e9 / ceiling)
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
    """Every row of the section at 1 thread, and the ceiling's products measured alone (GFLOP/s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        products = ceiling_products(cfg.head_dim, cfg.ceiling_n)
        alone = measure_ceiling(products, calls=5)
        rows = []
        for row in rows_for(cfg):
            rows.append(row if row.skipped else measure(row, cfg, products))
            if not row.skipped:
                log(f"{row.path} L={row.length} {'fwd+bwd' if row.backward else 'fwd'}: "
                    f"{statistics.median(row.fractions):.0%} of the ceiling")
    finally:
        torch.set_num_threads(before)
    return rows, alone


def write(path: Path, text: str) -> None:
    """Replace the section between the markers of a Markdown file (appended under its title if absent)."""
    doc = path.read_text()
    block = f"{START}\n{text}\n{END}"
    if START in doc:
        head, rest = doc.split(START, 1)
        doc = head + block + rest.split(END, 1)[1]
    else:
        doc = doc.rstrip() + f"\n\n## {TITLE}\n\n" + block + "\n"
    path.write_text(doc)


def report(cfg: Config, rows: list[Row], alone: dict[str, float], command: str, notes: str = "") -> str:
    ceiling = "; ".join(f"{name}: {rate:.1f}" for name, rate in alone.items())
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (f"`{command}`, run {when} (torch {torch.__version__}, 1 thread, B=1 H={cfg.heads} D={cfg.head_dim} "
            "float32)\n\n"
            f"Ceiling products measured alone (GFLOP/s, best of 5): {ceiling}. Each row's ceiling is the best of "
            "them, measured again in every round beside the path's call.\n\n" + table(rows))
    return text + ("\n\n" + notes if notes else "")


NOTES = """What bounds the rest (the profile column, and each path's code):

- `band-windows` (`kernels/band.py`): per slab, two torch `bmm` calls on thin products \
(`(n, bs, D) @ (n, D, W)` and `(n, bs, W) @ (n, W, Dv)`, D = 64), which run near the bmm rows of the \
ceiling rather than the square matmul, and between them one in-place pass of torch's fused softmax and a \
fill of the two masked corners over the slab's scores (in memory, not in registers); the copies are the \
edge blocks' zero-padded windows and, backward, the window gradients added back. The slab size and \
block sizes in use (`band_blocks.SLAB`, `band.BLOCK_SIZES`) measured no slower, forward at L = 4096, \
than slabs of 2^19, 2^20 or 2^22 score elements or blocks of 128 alone. Beyond this the softmax pass \
would have to move into the matmul's tiles (a fused kernel).
- `blocksparse-fused` (`kernels/blocksparse_fused.py`): torch's fused kernel per slab does most of the \
work; the rest is gathering each slab's key and value blocks (`index_select`: every key block is copied \
once per query block that reads it, a memory-bound copy of as many bytes as the slab's K and V) and, \
backward, adding their gradients back (`index_add_`).
- `torch-sdpa`: torch's fused kernel alone (scores, softmax and both products in cache-sized tiles); \
its fraction is torch's.
- `dense-reference`: scores and weights exist in memory; its softmax passes over `Lq x Lk` elements \
come on top of the two products.

On a shared machine the ceiling moves with the load; each round divides by the ceiling measured in \
that round, so a row's fraction can exceed 100% in a round where the load changed between the two."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=list(Config.lengths))
    ap.add_argument("--rounds", type=int, default=Config.rounds)
    ap.add_argument("--write", type=Path, help="replace the ceiling section of this Markdown file")
    args = ap.parse_args(argv)
    cfg = Config(lengths=tuple(args.lengths), rounds=args.rounds)
    rows, alone = run(cfg, log=lambda s: print(s, file=sys.stderr))
    command = "python benchmarks/ceiling.py" + (f" --lengths {' '.join(map(str, args.lengths))}"
                                                f" --rounds {args.rounds}")
    text = report(cfg, rows, alone, command, NOTES)
    print(text)
    if args.write:
        write(args.write, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
