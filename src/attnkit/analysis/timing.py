"""Side-by-side timing and peak memory of attnkit's backends against torch SDPA.

Every number is measured in the same process (memory: in a fresh child process
per method), as medians of several runs, and reported as a ratio against the
tool a user would otherwise pick. Nothing here asserts a time. ``attnkit bench`` uses
these directly; the benchmark suite's harness (``benchmarks/harness/`` in the source
tree, issue 7) builds its rows on :class:`Case` and :func:`time_interleaved`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..core import attention, explain
from .patterns import make_bias, make_mask

__all__ = ["Case", "Timing", "time_call", "time_interleaved", "methods", "run_case", "peak_memory", "with_backward"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Case:
    """One benchmark problem: sizes, dtype, mask and bias texts (see :mod:`.patterns`), pass."""

    batch: int = 1
    heads: int = 8
    q_len: int = 4096
    kv_len: int | None = None
    head_dim: int = 64
    dtype: str = "float32"
    mask: str | None = None
    backward: bool = False
    bias: str | None = None

    def inputs(self, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        lk = self.kv_len or self.q_len
        shapes = [(self.batch, self.heads, self.q_len, self.head_dim), (self.batch, self.heads, lk, self.head_dim),
                  (self.batch, self.heads, lk, self.head_dim)]
        return [torch.randn(s, generator=g).to(_DTYPES[self.dtype]).requires_grad_(self.backward) for s in shapes]


@dataclass
class Timing:
    method: str
    median_s: float
    min_s: float
    max_s: float
    output: torch.Tensor | None = None


def time_call(fn: Callable[[], object], repeats: int = 5, warmup: int = 1) -> tuple[float, float, float]:
    """``(median, min, max)`` seconds of ``fn()`` over ``repeats`` runs after ``warmup``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), max(times)


def time_interleaved(fns: Mapping[str, Callable[[], object]], repeats: int = 5, warmup: int = 1,
                     budget_s: float | None = None) -> dict[str, tuple[float, float, float, int]]:
    """``name -> (median, min, max, runs)`` seconds, the calls interleaved so that load changes hit every side.

    Each round runs every function once, in reversed order on odd rounds, so none
    of them always runs right after the same other one. With ``budget_s``, the
    rounds are cut to those that fit in it, judged from the warm-up round (at least one).
    """
    round_s = 0.0
    for _ in range(max(1, warmup) if budget_s else warmup):
        start = time.perf_counter()
        for fn in fns.values():
            fn()
        round_s = time.perf_counter() - start
    if budget_s and round_s > 0:
        repeats = max(1, min(repeats, int(budget_s / round_s)))
    times = {name: [] for name in fns}
    for i in range(repeats):
        for name, fn in (reversed(fns.items()) if i % 2 else fns.items()):
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(t), min(t), max(t), len(t)) for name, t in times.items()}


def _sdpa_dense(mask, q, k, v):
    """SDPA given the dense bool mask a user would build for it (built once, on first call)."""
    dense = []

    def run():
        if not dense:
            dense.append(mask.materialize(q.shape[2], k.shape[2], batch=q.shape[0], heads=q.shape[1]))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=dense[0])
    return run


def methods(case: Case, q, k, v, backends: Iterable[str] = ("auto", "blocksparse", "chunked", "sdpa")):
    """Name -> zero-argument callable returning the output, for every method that can run the case."""
    mask = make_mask(case.mask, case.q_len)
    modifier = make_bias(case.bias, case.heads)
    out = {"torch sdpa (no mask)": lambda: F.scaled_dot_product_attention(q, k, v)}
    if mask is not None:
        out["torch sdpa (dense bool mask)"] = _sdpa_dense(mask, q, k, v)
    for backend in backends:
        try:
            chosen = explain(q, k, v, mask=mask, bias=modifier, backend=backend).backend
        except ValueError:
            continue  # this backend cannot honour the case
        label = f"attnkit auto -> {chosen}" if backend == "auto" else f"attnkit {backend}"
        out[label] = lambda b=backend: attention(q, k, v, mask=mask, bias=modifier, backend=b)
    return out


def with_backward(fn, tensors):
    def run():
        for t in tensors:
            t.grad = None
        out = fn()
        out.sum().backward()
        return out
    return run


def run_case(case: Case, *, repeats: int = 5, backends=("auto", "blocksparse", "chunked", "sdpa"),
             progress: Callable[[str], None] | None = None) -> list[Timing]:
    """Time every method on the same inputs; keeps each output for the correctness column."""
    q, k, v = case.inputs()
    rows = []
    for name, fn in methods(case, q, k, v, backends).items():
        if progress:
            progress(name)
        call = with_backward(fn, (q, k, v)) if case.backward else fn
        with torch.set_grad_enabled(case.backward):
            med, lo, hi = time_call(call, repeats)
            output = fn().detach()
        rows.append(Timing(name, med, lo, hi, output))
    return rows


def peak_memory(case: Case, method: str, backends=("auto", "blocksparse", "chunked", "sdpa")) -> int:
    """Peak resident memory (bytes) one call of ``method`` adds, measured in a fresh child process."""
    spec = json.dumps({"case": case.__dict__, "method": method, "backends": list(backends)})
    done = subprocess.run([sys.executable, "-m", "attnkit.analysis._memory_child", spec],
                          capture_output=True, text=True, check=True)
    return int(done.stdout.strip().splitlines()[-1])
