"""PaTH attention: the chunk form against the parallel form (time and peak memory of forward + backward).

For each length L (default 256 ... 8192), :func:`attnkit.functional.path.path_attention` with FoX's
forget gate (B = 1, H = 4, D = Dv = 64, float32, unit ``w``, ``beta`` in ``[0, 2]``) at one thread:
forward + backward of ``form="chunk"`` (blocks of 64) and ``form="parallel"``, timed interleaved
(:func:`attnkit.lab.analysis.timing.time_interleaved`: median, min, max), and the peak each call adds,
measured in a fresh child process per form and length (:mod:`attnkit.lab.analysis.memory`). The
parallel form holds several ``L x L`` matrices per head and solves an ``L x L`` triangular system: it is
skipped, with its estimate, beyond ``--max-gib``. Nothing here asserts a time.

Usage: ``python benchmarks/path_forms.py [--lengths 256 1024 4096] [--write BENCHMARKS.md]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

NAME, TITLE = "path-forms", "PaTH attention: chunk and parallel forms (forward + backward)"
MODULE = "benchmarks.path_forms"
HEADS, DIM, CHUNK = 4, 64, 64


def step(length: int, form: str, chunk_size: int = CHUNK):
    """A closure running one forward + backward of ``form`` on seeded inputs of ``length``."""
    from attnkit.functional.path import path_attention

    g = torch.Generator().manual_seed(0)
    q, k, v, w = (torch.randn(1, HEADS, length, DIM, generator=g) for _ in range(4))
    w = F.normalize(w, dim=-1)
    beta = 2 * torch.rand(1, HEADS, length, generator=g)
    gates = F.logsigmoid(torch.randn(1, HEADS, length, generator=g) + 3)
    leaves = [t.requires_grad_() for t in (q, k, v, w, beta, gates)]

    def run():
        for t in leaves:
            t.grad = None
        path_attention(*leaves[:5], log_fgate=leaves[5], form=form, chunk_size=chunk_size).sum().backward()
    return run


def parallel_estimate_gib(length: int) -> float:
    """About eight ``L x L`` float32 matrices per head kept for the parallel form's backward."""
    return 8 * HEADS * length ** 2 * 4 / 2 ** 30


def child(payload: dict) -> int:
    """Bytes one forward + backward adds to the peak (run in a fresh process)."""
    from attnkit.lab.analysis.memory import peak_bytes, reset_peak

    torch.set_num_threads(1)
    run = step(payload["length"], payload["form"])
    base = reset_peak()
    run()
    return peak_bytes() - base


def peak(length: int, form: str, timeout: float = 1800.0) -> int:
    """The peak of one call, from a fresh child process."""
    from attnkit.lab.benchmarking.child import child_output

    return int(child_output(MODULE, {"length": length, "form": form}, timeout))


def rows(lengths, max_gib: float = 8.0, repeats: int = 5, log=lambda line: None) -> list[dict]:
    """One row per length: ``seconds`` (form -> (median, min, max, runs)) and ``peak`` (form -> bytes)."""
    from attnkit.lab.analysis.timing import time_interleaved

    torch.set_num_threads(1)
    found = []
    for length in lengths:
        forms = ["chunk"] + (["parallel"] if parallel_estimate_gib(length) <= max_gib else [])
        row = {"length": length, "seconds": time_interleaved({f: step(length, f) for f in forms}, repeats, warmup=1,
                                                             budget_s=60.0),
               "peak": {f: peak(length, f) for f in forms}}
        log(f"L = {length}: {row}")
        found.append(row)
    return found


def table(found: list[dict]) -> str:
    lines = ["| L | chunk fwd+bwd (median, min-max) | parallel fwd+bwd | chunk / parallel | chunk peak MiB | "
             "parallel peak MiB |", "|---:|---:|---:|---:|---:|---:|"]
    def timed(t):
        return f"{t[0] * 1e3:.1f} ms ({t[1] * 1e3:.1f}-{t[2] * 1e3:.1f})" if t else "skipped"

    def mib(b):
        return f"{b / 2 ** 20:.0f}" if b is not None else "skipped"

    for r in found:
        c, p = r["seconds"]["chunk"], r["seconds"].get("parallel")
        ratio = f"{c[0] / p[0]:.2f}" if p else "-"
        lines.append(f"| {r['length']} | {timed(c)} | {timed(p)} | {ratio} | {mib(r['peak']['chunk'])} | "
                     f"{mib(r['peak'].get('parallel'))} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    from attnkit.lab.benchmarking.child import run_as_child

    if run_as_child(child, argv):  # a fresh child process: one measurement
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048, 4096, 8192])
    ap.add_argument("--max-gib", type=float, default=8.0, help="skip the parallel form past this estimate")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--write", type=Path, help="replace the path-forms section in this Markdown file")
    args = ap.parse_args(argv)
    found = rows(args.lengths, args.max_gib, args.repeats, log=lambda line: print(line, file=sys.stderr))
    lengths = " ".join(map(str, args.lengths))
    text = (f"`python benchmarks/path_forms.py --lengths {lengths}` (torch {torch.__version__}, B=1, H={HEADS}, "
            f"D=Dv={DIM}, float32, forget gate, chunk {CHUNK}, 1 thread; the peak one call adds, each in a fresh "
            "process)\n\n" + table(found))
    from attnkit.lab.benchmarking.sections import emit

    return emit(text, args.write, NAME, TITLE)


if __name__ == "__main__":
    sys.exit(main())
