"""The suite's section of BENCHMARKS.md: how it measures, the machine and its ceiling, one table per target, misses.

Pure text, from the rows (:class:`attnkit.lab.benchmarking.rows.Row`) and the machine
(:mod:`attnkit.lab.benchmarking.machine`); ``benchmarks/run.py`` writes it between the
suite's markers (:mod:`attnkit.lab.benchmarking.sections`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from attnkit.lab.benchmarking.report import misses, rows_table
from attnkit.lab.benchmarking.rows import Row

__all__ = ["NAME", "TITLE", "machine_section", "render"]

NAME, TITLE = "suite", "Benchmark suite"


def machine_section(info: Mapping, ceiling: Mapping, command: str) -> list[str]:
    """The command, the machine and the measured matmul ceiling (:func:`attnkit.lab.benchmarking.machine.ceiling`)."""
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


def render(*, intro: Sequence[str], info: Mapping, ceiling: Mapping, command: str, rows: Sequence[Row],
           targets: Mapping[int, str], plots: Sequence[tuple[str, str]] = (),
           extras: Mapping[int, Sequence[str]] | None = None) -> str:
    """The text of the suite's section (what goes between its markers).

    ``extras[target]`` are lines shown under that target's table (or alone, for a target without rows).
    """
    extras = extras or {}
    lines = [*intro, "", *machine_section(info, ceiling, command), ""]
    for target, heading in targets.items():
        mine = [r for r in rows if r.target == target]
        lines += [f"### {target}. {heading}", ""]
        lines += [*rows_table(mine), ""] if mine else [] if extras.get(target) else ["Not measured in this run.", ""]
        lines += [*extras[target], ""] if extras.get(target) else []
    if plots:
        lines += ["### Time and memory against L", ""]
        lines += [f"![{caption}]({path})" for caption, path in plots] + [""]
    lines += ["### Misses", "", *misses(rows)]
    return "\n".join(lines)
