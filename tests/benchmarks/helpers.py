"""Shared by the benchmark tests: a tiny case and the suite's section rendered from given rows."""

from __future__ import annotations

from benchmarks.harness.report import render

from attnkit.analysis.timing import Case


def tiny(mask="sliding_window(3, 2)", backward=False, **kw):
    return Case(batch=2, heads=3, q_len=40, head_dim=8, mask=mask, backward=backward, **kw)


def render_suite(rows):
    info = {"date": "2026-01-01 00:00 UTC", "cpu": "cpu", "cores": 2, "flags": ["avx2"],
            "torch_cpu_capability": "AVX2", "torch": "2.x", "threads": 2, "python": "3.11"}
    ceil = {"float32": {"1": 100.0, "all": 190.0, "n": 2048}}
    return render(title="Suite", intro=["intro"], info=info, ceiling=ceil, command="python benchmarks/run.py",
                  rows=rows, targets={1: "dense", 2: "window", 3: "patterns"}, plots=[("window", "plots/w.png")],
                  extras={2: ["a note"]})
