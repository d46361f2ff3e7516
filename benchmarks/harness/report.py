"""Markdown for the benchmark suite: machine section, one table per target, misses, and the BENCHMARKS.md rewrite.

Pure text functions of :class:`~benchmarks.harness.rows.Row` lists, so the
suite, ``attnkit bench`` and the tests render the same tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .rows import Row

__all__ = ["fmt_ms", "goal_text", "rows_table", "misses", "machine_section", "render", "rewrite",
           "SUITE_START", "SUITE_END", "SCALING_START", "SCALING_END"]

SUITE_START, SUITE_END = "<!-- suite:start -->", "<!-- suite:end -->"
SCALING_START, SCALING_END = "<!-- scaling:start -->", "<!-- scaling:end -->"


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


def machine_section(info: Mapping, ceiling: Mapping, command: str) -> list[str]:
    flags = ", ".join(info.get("flags", [])) or "none of AVX-512/AMX"
    lines = [f"Command: `{command}`, run {info['date']}.", "",
             f"Machine: {info['cpu']}, {info['cores']} cores, vector flags: {flags} "
             f"(torch CPU capability {info['torch_cpu_capability']}); torch {info['torch']}, "
             f"{info['threads']} torch threads, Python {info['python']}.", "",
             "Measured matmul ceiling (square matmul, median GFLOP/s):", "",
             f"| dtype | size | 1 thread | {info['threads']} threads (this run's setting) |", "|---|---|---|---|"]
    for dtype, c in ceiling.items():
        lines.append(f"| {dtype} | {c['n']} | {c['1']:.1f} | {c['all']:.1f} |")
    return lines


def render(*, title: str, intro: Sequence[str], info: Mapping, ceiling: Mapping, command: str,
           rows: Sequence[Row], targets: Mapping[int, str], plots: Sequence[tuple[str, str]] = (),
           extras: Mapping[int, Sequence[str]] | None = None) -> str:
    """The suite's whole section of BENCHMARKS.md (between :data:`SUITE_START` and :data:`SUITE_END`).

    ``extras[target]`` are lines shown under that target's table (or alone, for a target without rows).
    """
    extras = extras or {}
    lines = [SUITE_START, f"## {title}", "", *intro, "", *machine_section(info, ceiling, command), ""]
    for target, heading in targets.items():
        mine = [r for r in rows if r.target == target]
        lines += [f"### {target}. {heading}", ""]
        lines += [*rows_table(mine), ""] if mine else [] if extras.get(target) else ["Not measured in this run.", ""]
        lines += [*extras[target], ""] if extras.get(target) else []
    if plots:
        lines += ["### Time and memory against L", ""]
        lines += [f"![{caption}]({path})" for caption, path in plots] + [""]
    lines += ["### Misses", "", *misses(rows), SUITE_END]
    return "\n".join(lines) + "\n"


# Sections other scripts write into BENCHMARKS.md (scaling.py, overhead.py, the distributed bench,
# transformers_models.py, ceiling.py, compiled.py, whole_models.py): the suite keeps each byte for byte, with the
# heading just above its marker.
KEPT_SECTIONS = ("scaling", "overhead", "distributed", "transformers", "ceiling", "compiled", "models")


def _kept_section(old: str, name: str) -> str | None:
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start not in old or end not in old:
        return None
    i = old.index(start)
    before = old[:i].rstrip("\n")
    heading = before.rfind("\n") + 1
    if before[heading:].startswith("## ") and not before[heading:].startswith("## Benchmark suite"):
        i = heading
    return old[i:old.index(end, i) + len(end)]


def rewrite(old: str, suite: str, header: str = "# Benchmarks") -> str:
    """BENCHMARKS.md with ``suite`` as its content and the other scripts' sections kept byte for byte."""
    parts = [header, "", suite.strip()]
    for name in KEPT_SECTIONS:
        section = _kept_section(old, name)
        if section is not None:
            parts += ["", section]
    return "\n".join(parts) + "\n"
