"""The benchmark suite: every target's comparison in one run, written into BENCHMARKS.md.

Usage::

    python benchmarks/run.py              # full suite (~15 min on 2 cores), rewrites BENCHMARKS.md
    python benchmarks/run.py --quick      # small sizes: a smoke run, written under benchmarks/results/quick/
    python benchmarks/run.py --only 2 5   # some targets (rows of the others come from the cache, if any)
    python benchmarks/run.py --fresh      # ignore cached rows

Each spec is measured in a fresh child process (``--in-process``: in this one), so
no row inherits the heap and caches of the rows before it (see
:mod:`attnkit.lab.benchmarking.isolated`). Each row is cached in
``benchmarks/results/<spec key>.json`` as soon as it is measured, so an
interrupted run resumes where it stopped. A cached row is reused only for the
same spec, torch version and attnkit sources (a hash of the kernels, masks, biases,
entry point and benchmarking files it runs: see ``MEASURED_CODE``). The suite writes its
own section of BENCHMARKS.md (:mod:`attnkit.lab.benchmarking.sections`); every other byte of
the file stays as it is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shlex
import subprocess
import sys
import traceback
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))  # the repository root: benchmarks/ imports as a package

from attnkit.lab.benchmarking.isolated import run_spec_isolated  # noqa: E402
from attnkit.lab.benchmarking.machine import ceiling, machine_info  # noqa: E402
from attnkit.lab.benchmarking.rows import Row, Spec, run_spec, sizes_text  # noqa: E402
from attnkit.lab.benchmarking.sections import write_section  # noqa: E402
from attnkit.runtime import retain_freed_memory  # noqa: E402
from benchmarks.report_notes import INTRO, extras  # noqa: E402
from benchmarks.suite import TITLES, specs  # noqa: E402
from benchmarks.suite_report import NAME, TITLE, render  # noqa: E402

# Relative to the repository root: attnkit's sources a row runs, the measuring code included.
MEASURED_CODE = tuple(f"src/attnkit/{name}" for name in (
    "core.py", "bias.py", "masks.py", "runtime.py", "kernels", "functional", "nn/additive.py",
    "nn/additive_scores.py", "analysis/timing.py", "benchmarking/methods.py", "benchmarking/flex.py",
    "benchmarking/isolated.py"))


def code_version() -> str:
    """A hash of the sources the rows run, and the torch version: a row cached under another is stale."""
    root = HERE.parent
    digest = hashlib.sha1(torch.__version__.encode())
    for name in MEASURED_CODE:
        for path in sorted((root / name).rglob("*.py")) if (root / name).is_dir() else [root / name]:
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes() if path.exists() else b"")
    return f"{digest.hexdigest()[:16]} torch {torch.__version__}"


def _load(path: Path, spec: Spec, version: str) -> list[Row] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("spec") != spec.to_json() or data.get("version") != version:
        return None
    return [Row(**r) for r in data["rows"]]


def _save(path: Path, spec: Spec, rows: list[Row], version: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"spec": spec.to_json(), "version": version, "rows": [r.__dict__ for r in rows]},
                              indent=1))
    tmp.replace(path)  # a run killed mid-write leaves no half file


def _error_row(spec: Spec, err: Exception) -> Row:
    case = spec.case
    where = traceback.extract_tb(err.__traceback__)[-1]
    reason = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''} " \
             f"({Path(where.filename).name}:{where.lineno})"
    return Row(spec.target, spec.label, sizes_text(case, spec.compare == ("additive",)),
               "fwd+bwd" if case.backward else "fwd", "attnkit", ",".join(spec.compare), verdict="ERROR",
               length=case.q_len, dtype=case.dtype, notes={"error": reason})


def _bar(total: int):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="suite", file=sys.stderr, leave=False)


def measure(all_specs: list[Spec], results: Path, *, fresh: bool, only: set[int] | None, ceil: dict,
            isolated: bool = True, retain: bool = False) -> list[Row]:
    """Rows of every spec: from the cache, or measured now (each spec in a fresh process unless not
    ``isolated``) and cached at once."""
    rows, bar, version = [], _bar(len(all_specs)), code_version()
    for spec in all_specs:
        path = results / f"{spec.key}.json"
        got = None if fresh and (only is None or spec.target in only) else _load(path, spec, version)
        if got is None and (only is None or spec.target in only):
            step = bar.set_postfix_str if bar else (lambda label: print(f"  {label} ...", file=sys.stderr))
            try:
                if isolated:
                    step(f"{spec.label}: measuring in a fresh process")
                    got = run_spec_isolated(spec, ceiling=ceil, retain_memory=retain)
                else:
                    got = run_spec(spec, ceiling=ceil, progress=step, profile_misses=True)
                _save(path, spec, got, version)
            except Exception as err:  # one failing row must not end the suite; it is reported, not cached
                got = [_error_row(spec, err)]
            for r in got:
                ratio = "n/a" if r.ratio is None else f"{r.ratio:.3f}"
                print(f"[{r.target}] {r.label} {r.pass_} {r.sizes}: {r.ours} vs {r.theirs}: ratio {ratio} "
                      f"-> {r.verdict}", flush=True)
        if bar:
            bar.update(1)
        rows += got or []
    if bar:
        bar.close()
    for r in rows:  # fractions against this run's ceiling, cached rows included
        peak = ceil.get(r.dtype)
        r.ceiling_frac = r.gflops / peak if peak and r.gflops else None
    return rows


def plots(rows: list[Row], folder: Path, relative_to: Path) -> list[tuple[str, str]]:
    """Time and memory against L, one PNG per family of rows; ``[(caption, path)]``."""
    try:
        from attnkit.lab.viz import scaling_plot
    except ImportError:
        return []
    families = {
        "window": ("sliding window ±128, forward+backward", lambda r: r.target == 2 and r.pass_ == "fwd+bwd"),
        "dense": ("dense attention (no mask), forward+backward",
                  lambda r: r.target == 1 and r.label == "no mask" and r.pass_ == "fwd+bwd"),
        "alibi": ("ALiBi bias, forward+backward", lambda r: r.target == 4 and r.label == "alibi"
                  and r.pass_ == "fwd+bwd"),
    }
    out = []
    for name, (caption, keep) in families.items():
        series = {}
        for r in (r for r in rows if keep(r)):
            mine = "attnkit " + r.ours.split(" -> ")[0].removeprefix("attnkit ")  # the backend auto picks varies
            series.setdefault(mine, {})[r.length] = (r.length, r.ours_s[0], r.ours_mem)
            if r.theirs_s:
                series.setdefault(r.theirs, {})[r.length] = (r.length, r.theirs_s[0], r.theirs_mem)
        series = {k: sorted(v.values()) for k, v in series.items() if len(v) > 1}
        if not series:
            continue
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{name}.png"
        scaling_plot(series, path=path, title=caption)
        out.append((caption, Path(os.path.relpath(path, relative_to)).as_posix()))
    return out


OVERHEAD = 8  # the target number of the dispatch-overhead rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--fresh", action="store_true", help="ignore cached rows (of --only targets, if given)")
    parser.add_argument("--only", type=int, nargs="+", default=None,
                        help=f"measure only these targets (1-6; {OVERHEAD}: dispatch overhead, benchmarks/overhead.py)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--in-process", action="store_true",
                        help="measure every spec in this process (default: each in a fresh child process)")
    parser.add_argument("--retain-memory", action="store_true",
                        help="attnkit.runtime.retain_freed_memory() for the whole run (default: glibc's defaults)")
    parser.add_argument("--out", default=None, help="default: BENCHMARKS.md (quick: benchmarks/results/quick/)")
    parser.add_argument("--print", action="store_true", help="print the section instead of writing a file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.retain_memory:
        retain_freed_memory()  # both sides of every comparison run with it (see attnkit.runtime)
    results = HERE / "results" / ("quick" if args.quick else "")
    out = Path(args.out) if args.out else (results / "BENCHMARKS.md" if args.quick else HERE.parent / "BENCHMARKS.md")
    command = "python benchmarks/run.py" + "".join(f" {shlex.quote(a)}" for a in (argv or sys.argv[1:]))
    info = machine_info()
    ceil = ceiling(512 if args.quick else 2048, 0.3 if args.quick else 1.0)
    rows = measure(specs(args.quick), results, fresh=args.fresh, only=set(args.only) if args.only else None,
                   ceil={k: v["all"] for k, v in ceil.items()}, isolated=not args.in_process,
                   retain=args.retain_memory)
    figures = [] if args.print else plots(rows, (results if args.quick else HERE) / "plots", out.parent)
    text = render(intro=INTRO, info=info, ceiling=ceil, command=command, rows=rows, targets=TITLES, plots=figures,
                  extras=extras(rows, info, ceil))
    print(text)
    if not args.print:
        write_section(out, NAME, text, TITLE)
        print(f"wrote {out}", file=sys.stderr)
    if args.only is None or OVERHEAD in args.only:  # at 1 thread, in a fresh process, its own section
        write = [] if args.print else ["--write", str(out.resolve())]
        subprocess.run([sys.executable, "-m", "benchmarks.overhead", "--rounds", "5" if args.quick else "15", *write],
                       check=True, cwd=HERE.parent)
    return 0 if all(math.isfinite(r.ours_s[0]) for r in rows if r.ours_s) else 1


if __name__ == "__main__":
    sys.exit(main())
