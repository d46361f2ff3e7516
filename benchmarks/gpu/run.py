"""The GPU rows (:mod:`benchmarks.gpu.rows`): measured on a CUDA device, kept as JSON, written into BENCHMARKS.md.

Usage::

    python -m benchmarks.gpu.run --budget 240                # measure on cuda, rows saved as they finish
    python -m benchmarks.gpu.run --report BENCHMARKS.md      # write the GPU section from the saved rows
    python -m benchmarks.gpu.run --quick --device cpu        # a smoke run of the machinery, tiny sizes

Rows go to ``benchmarks/results/gpu/rows.json`` (``--results``), each as soon as it is
measured, so a run stopped by its budget keeps what it did; ``--report`` builds the
section from that file alone, and says so when no GPU has measured anything yet.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parents[1]) not in sys.path:
    sys.path.insert(0, str(HERE.parents[1]))  # the repository root: benchmarks/ imports as a package

from attnkit.lab.benchmarking.report import goal_text  # noqa: E402
from attnkit.lab.benchmarking.sections import write_section  # noqa: E402
from benchmarks.gpu.rows import GpuRow, measure, rows  # noqa: E402

NAME, TITLE = "gpu", "On a GPU: attnkit against torch's engines"
RESULTS = HERE.parents[0] / "results" / "gpu" / "rows.json"
NOT_MEASURED = ("Not yet measured: no GPU has run these rows. On a machine with one NVIDIA GPU, "
                "`bash benchmarks/gpu/check.sh` runs the tests marked `cuda` and these rows (within 8 minutes) "
                "and writes this section from `benchmarks/results/gpu/rows.json`.")


def _spread(ms) -> str:
    return "n/a" if not ms else f"{ms[0]:.2f} ({ms[1]:.2f}-{ms[2]:.2f})"


def _mib(value) -> str:
    return "n/a" if value is None else f"{value:.0f}"


def render(found: list[dict], planned: int | None = None) -> str:
    """The section's Markdown from measured rows (or the line saying none were measured); ``planned``: rows the
    run meant to measure."""
    measured = [r for r in found if r.get("ratio") is not None or r.get("verdict") in ("n/a", "ERROR")]
    if not measured:
        return NOT_MEASURED
    first = measured[0]
    head = (f"`bash benchmarks/gpu/check.sh` on {first.get('device', '?')} (torch {first.get('torch', '?')}; "
            "ratio = attnkit time / other time, medians over interleaved rounds, the device synchronised around "
            "each sample; compile time excluded and noted; peak MiB from the CUDA allocator, per side)\n")
    lines = ["| case | pass | sizes | attnkit | vs | attnkit ms | theirs ms | ratio | target | result | max abs diff "
             "| attnkit MiB | theirs MiB | notes |", "|" + "---|" * 14]
    for r in measured:
        ratio = "n/a" if r.get("ratio") is None else f"{r['ratio']:.3f}"
        diff = "n/a" if r.get("max_diff") is None else f"{r['max_diff']:.1e}"
        notes = "; ".join(f"{k}: {v}" for k, v in r.get("notes", {}).items()).replace("|", "/")
        lines.append(f"| {r['label']} | {r['pass']} | {r['sizes']} | {r.get('ours', 'attnkit')} | "
                     f"{r.get('theirs', r['against'])} | {_spread(r.get('ours_ms'))} | {_spread(r.get('theirs_ms'))} | "
                     f"{ratio} | {goal_text(r['goal'])} | {r['verdict']} | {diff} | {_mib(r.get('ours_mib'))} | "
                     f"{_mib(r.get('theirs_mib'))} | {notes} |")
    left = (planned or 0) - len(found)
    tail = f"\n\n{left} more rows were not reached within the run's budget." if left > 0 else ""
    return head + "\n" + "\n".join(lines) + tail


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"planned": 0, "rows": []}


def run(chosen: list[GpuRow], path: Path, *, device: str, repeats: int, budget_s: float) -> list[dict]:
    """Measure the rows in order until the budget is spent, saving the list after each row."""
    found, start = [], time.monotonic()
    path.parent.mkdir(parents=True, exist_ok=True)
    for row in chosen:
        if time.monotonic() - start > budget_s:
            break
        print(f"{row.label} vs {row.against}, {row.sizes()}, {'fwd+bwd' if row.backward else 'fwd'}", file=sys.stderr)
        try:
            found.append(measure(row, device=device, repeats=repeats))
        except Exception as err:  # one failing row is reported, not the end of the run
            found.append({**row.__dict__, "sizes": row.sizes(), "pass": "fwd+bwd" if row.backward else "fwd",
                          "verdict": "ERROR", "notes": {"error": f"{type(err).__name__}: {str(err)[:200]}"}})
            traceback.print_exc()
        path.write_text(json.dumps({"planned": len(chosen), "rows": found}, indent=1))
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run of the machinery")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget", type=float, default=240.0, help="seconds: no new row starts after this")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--only", default=None, help="comma-separated comparisons to run (sdpa,sdpa-mask,flex,flash-attn)")
    ap.add_argument("--report", type=Path, help="write the GPU section of this Markdown file from --results; no runs")
    args = ap.parse_args(argv)
    if args.report:
        saved = _load(args.results)
        write_section(args.report, NAME, render(saved["rows"], saved["planned"]), TITLE)
        return 0
    chosen = [r for r in rows(args.quick) if args.only is None or r.against in args.only.split(",")]
    found = run(chosen, args.results, device=args.device, repeats=args.repeats, budget_s=args.budget)
    print(render(found, len(chosen)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
