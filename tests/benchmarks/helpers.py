"""Shared by the benchmark script tests: the suite's section rendered from given rows."""

from __future__ import annotations

from benchmarks.suite_report import render


def render_suite(rows):
    info = {"date": "2026-01-01 00:00 UTC", "cpu": "cpu", "cores": 2, "flags": ["avx2"],
            "torch_cpu_capability": "AVX2", "torch": "2.x", "threads": 2, "python": "3.11"}
    ceil = {"float32": {"1": 100.0, "all": 190.0, "n": 2048}}
    return render(intro=["intro"], info=info, ceiling=ceil, command="python benchmarks/run.py", rows=rows,
                  targets={1: "dense", 2: "window", 3: "patterns"}, plots=[("window", "plots/w.png")],
                  extras={2: ["a note"]})
