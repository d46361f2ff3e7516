"""Markdown for benchmark rows: the table of compared pairs and the list of missed targets.

Pure text functions of :class:`~.rows.Row` lists, so ``attnkit bench``, the suite
that writes BENCHMARKS.md and the tests render the same tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .rows import Row

__all__ = ["fmt_ms", "goal_text", "rows_table", "misses"]


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"


def _spread(times: Sequence[float] | None) -> str:
    if not times:
        return "n/a"
    return f"{fmt_ms(times[0])} ({fmt_ms(times[1])}-{fmt_ms(times[2])})"


def goal_text(goal: float | None, mem_goal: float | None = None) -> str:
    """``0.2`` -> "≥ 5x faster", ``1.05`` -> "≤ 1.05x"; memory goals appended."""
    parts = []
    if goal is not None:
        parts.append(f"≥ {1 / goal:.3g}x faster" if goal < 1 else f"≤ {goal:.3g}x")
    if mem_goal is not None:
        parts.append(f"memory ≤ {mem_goal:.3g}x")
    return ", ".join(parts) or "—"


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.0f}"


def _notes(row: Row) -> str:
    items = [f"{k}: {v}" for k, v in row.notes.items()]
    return "; ".join(items).replace("|", "/")


def rows_table(rows: Iterable[Row]) -> list[str]:
    """A Markdown table: each row one compared pair (columns for memory and density only when measured)."""
    rows = list(rows)
    memory = any(r.ours_mem is not None for r in rows)
    density = any(r.density is not None for r in rows)
    head = ["case", "pass", "sizes", "attnkit", "vs", "attnkit ms (min-max)", "theirs ms (min-max)", "ratio",
            "target", "result", "max abs diff", "GFLOP/s (of ceiling)"]
    head += ["block density", "ratio / density"] if density else []
    head += ["attnkit MiB", "theirs MiB", "memory ratio"] if memory else []
    lines = ["| " + " | ".join(head + ["runs", "notes"]) + " |", "|" + "---|" * (len(head) + 2)]
    for r in rows:
        ratio = "n/a" if r.ratio is None else f"{r.ratio:.3f}"
        diff = "n/a" if r.max_diff is None else f"{r.max_diff:.1e}" + ("" if r.diff_ok else " (WRONG)")
        flops = "n/a" if r.gflops is None else f"{r.gflops:.1f}" + (
            "" if r.ceiling_frac is None else f" ({100 * r.ceiling_frac:.0f}%)")
        result = f"**{r.verdict}**" if r.verdict in ("MISS", "WRONG", "ERROR") else r.verdict
        cells = [r.label, r.pass_, r.sizes, r.ours, r.theirs, _spread(r.ours_s), _spread(r.theirs_s), ratio,
                 goal_text(r.goal, r.mem_goal), result, diff, flops]
        if density:
            per = r.ratio / r.density if r.ratio is not None and r.density else None
            cells += ["—" if r.density is None else f"{r.density:.3f}", "—" if per is None else f"{per:.2f}"]
        if memory:
            mem = r.ours_mem / r.theirs_mem if r.ours_mem and r.theirs_mem else None
            cells += [_mib(r.ours_mem), _mib(r.theirs_mem), "n/a" if mem is None else f"{mem:.2f}"]
        lines.append("| " + " | ".join(cells + [str(r.runs), _notes(r)]) + " |")
    return lines


def misses(rows: Iterable[Row]) -> list[str]:
    """One bullet per row that missed its target (or was wrong), with the top operators of attnkit's side."""
    out = []
    for r in rows:
        if r.verdict not in ("MISS", "WRONG", "ERROR"):
            continue
        why = ("outputs differ" if r.verdict == "WRONG" else f"failed: {r.notes.get('error')}"
               if r.verdict == "ERROR" else f"ratio {r.ratio:.3f}, target {goal_text(r.goal, r.mem_goal)}")
        if r.verdict == "MISS" and r.mem_goal is not None and r.ours_mem and r.theirs_mem:
            why += f", memory ratio {r.ours_mem / r.theirs_mem:.2f}"
        out.append(f"- target {r.target}, {r.label} ({r.pass_}, {r.sizes}), {r.ours} vs {r.theirs}: {why}.")
        if r.profile:
            out.append("  Top operators of attnkit's side (self CPU time, one call): " + "; ".join(r.profile) + ".")
    return out or ["- none: every target with a measured ratio was reached."]
