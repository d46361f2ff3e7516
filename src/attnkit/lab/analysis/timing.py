"""The one timing loop of attnkit's measurements, and the side-by-side table of ``attnkit bench``.

Every time attnkit reports (``attnkit bench`` and its comparisons, ``attnkit scaling``,
the whole-model and ceiling rows, the scripts that write BENCHMARKS.md) is measured by
:func:`time_rounds`: the calls interleaved round by round (the order reversed every other
round, so a change of load hits every side), after a warm-up, on a device synchronised
around each timed sample when the tensors live on CUDA (its kernels run asynchronously:
without a synchronisation the clock would measure the launch, not the work).
:func:`time_interleaved` summarises the samples as medians and spread; :func:`time_once`
times a single call (a compile, a block mask) through the same loop.

The rest of this module is the default table of ``attnkit bench``: attnkit's backends
against torch SDPA on one :class:`Case`, and the peak memory of one method in a fresh
child process (:mod:`attnkit.lab.analysis.memory`). Nothing here asserts a time.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from ...core import attention, explain
from ...errors import BackendError
from .patterns import make_bias, make_mask

__all__ = ["Case", "Timing", "synchronizer", "time_rounds", "time_interleaved", "time_once", "spread", "methods",
           "run_case", "peak_memory", "with_backward"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Case:
    """One benchmark problem: sizes, dtype, mask and bias texts (see :mod:`.patterns`), pass, device."""

    batch: int = 1
    heads: int = 8
    q_len: int = 4096
    kv_len: int | None = None
    head_dim: int = 64
    dtype: str = "float32"
    mask: str | None = None
    backward: bool = False
    bias: str | None = None
    device: str = "cpu"

    def inputs(self, seed: int = 0):
        """``[q, k, v]``: the same numbers on every device (drawn on the CPU, then moved)."""
        g = torch.Generator().manual_seed(seed)
        lk = self.kv_len or self.q_len
        shapes = [(self.batch, self.heads, self.q_len, self.head_dim), (self.batch, self.heads, lk, self.head_dim),
                  (self.batch, self.heads, lk, self.head_dim)]
        return [torch.randn(s, generator=g).to(self.device, _DTYPES[self.dtype]).requires_grad_(self.backward)
                for s in shapes]


@dataclass
class Timing:
    method: str
    median_s: float
    min_s: float
    max_s: float
    output: torch.Tensor | None = None


def synchronizer(device) -> Callable[[], None] | None:
    """What waits for the work queued on ``device``: ``torch.cuda.synchronize`` on CUDA, None on the CPU."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return lambda: torch.cuda.synchronize(device)


def time_rounds(fns: Mapping[str, Callable[[], object]], repeats: int = 5, warmup: int = 1, *,
                budget_s: float | None = None, calls: int = 1, device=None,
                before: Callable[[], object] | None = None) -> dict[str, list[float]]:
    """``name -> seconds per call`` in each timed round, the calls interleaved.

    Each round runs every function once, in reversed order on odd rounds, so none
    of them always runs right after the same other one; ``warmup`` untimed rounds
    come first. A sample is ``calls`` consecutive calls divided by ``calls`` (calls
    of microseconds need many per sample). With ``budget_s`` the rounds are cut to
    those that fit in it, judged from a timed warm-up round (at least one round).
    On a CUDA ``device`` the device is synchronised before the clock starts and
    before it stops. ``before`` runs before every sample, untimed (a barrier
    between processes, clearing gradients).

    Example:
        >>> order = []
        >>> times = time_rounds({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, repeats=2)
        >>> order, [len(t) for t in times.values()]
        (['a', 'b', 'a', 'b', 'b', 'a'], [2, 2])
    """
    sync = synchronizer(device) or (lambda: None)
    round_s = 0.0
    for _ in range(max(1, warmup) if budget_s else warmup):
        sync()
        start = time.perf_counter()
        for fn in fns.values():
            fn()
        sync()
        round_s = time.perf_counter() - start
    if budget_s and round_s > 0:
        repeats = max(1, min(repeats, int(budget_s / round_s)))
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(repeats):
        for name, fn in (reversed(fns.items()) if i % 2 else fns.items()):
            if before is not None:
                before()
            sync()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            sync()
            times[name].append((time.perf_counter() - start) / calls)
    return times


def spread(times: list[float]) -> tuple[float, float, float, int]:
    """``(median, min, max, runs)`` of a list of samples."""
    return statistics.median(times), min(times), max(times), len(times)


def time_interleaved(fns: Mapping[str, Callable[[], object]], repeats: int = 5, warmup: int = 1,
                     budget_s: float | None = None, *, calls: int = 1,
                     device=None) -> dict[str, tuple[float, float, float, int]]:
    """``name -> (median, min, max, runs)`` seconds of :func:`time_rounds` (same arguments)."""
    rounds = time_rounds(fns, repeats, warmup, budget_s=budget_s, calls=calls, device=device)
    return {name: spread(t) for name, t in rounds.items()}


def time_once(fn: Callable[[], object], device=None) -> tuple[float, object]:
    """``(seconds, result)`` of one call of ``fn``, not warmed up: a compile, the building of a block mask."""
    result = []
    seconds = time_rounds({"call": lambda: result.append(fn())}, repeats=1, warmup=0, device=device)["call"][0]
    return seconds, result[0]


def _sdpa_dense(mask, q, k, v):
    """SDPA given the dense bool mask a user would build for it (built once, on first call)."""
    dense = []

    def run():
        if not dense:
            dense.append(mask.materialize(q.shape[2], k.shape[2], batch=q.shape[0], heads=q.shape[1],
                                          device=q.device))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=dense[0])
    return run


def methods(case: Case, q, k, v, backends: Iterable[str] = ("auto", "blocksparse", "chunked", "sdpa"),
            refused: dict[str, str] | None = None):
    """Name -> zero-argument callable returning the output, for every method that can run the case.

    ``refused``, when given, receives each backend that cannot run it and why (its error's message).
    """
    mask = make_mask(case.mask, case.q_len)
    modifier = make_bias(case.bias, case.heads)
    if isinstance(modifier, torch.nn.Module):
        modifier = modifier.to(q.device)
    out = {"torch sdpa (no mask)": lambda: F.scaled_dot_product_attention(q, k, v)}
    if mask is not None:
        out["torch sdpa (dense bool mask)"] = _sdpa_dense(mask, q, k, v)
    for backend in backends:
        try:
            chosen = explain(q, k, v, mask=mask, bias=modifier, backend=backend).backend
        except ValueError as err:  # this backend cannot honour the case
            if refused is not None:
                refused[backend] = str(err).split(": ", 1)[-1]
            continue
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
             progress: Callable[[str], None] | None = None, refused: dict[str, str] | None = None) -> list[Timing]:
    """Time every method on the same inputs, interleaved; keeps each output for the correctness column.

    A backend that cannot run the case is left out and named in ``refused`` (backend -> why); when no
    backend asked for can, BackendError says why for each, before anything is timed.
    """
    q, k, v = case.inputs()
    dropped: dict[str, str] = {}
    found = methods(case, q, k, v, backends, dropped)
    if dropped and set(dropped) == set(backends):
        raise BackendError("no backend asked for can run this case: " +
                           "; ".join(f"{b}: {why}" for b, why in dropped.items()))
    if refused is not None:
        refused.update(dropped)
    calls = {name: with_backward(fn, (q, k, v)) if case.backward else fn for name, fn in found.items()}
    if progress:
        progress(f"timing {len(calls)} methods")
    rows = []
    with torch.set_grad_enabled(case.backward):
        stats = time_interleaved(calls, repeats, device=q.device)
        for name, fn in found.items():
            med, lo, hi, _ = stats[name]
            rows.append(Timing(name, med, lo, hi, fn().detach()))
    return rows


def peak_memory(case: Case, method: str, backends=("auto", "blocksparse", "chunked", "sdpa")) -> int:
    """Peak memory (bytes) one call of ``method`` adds, measured in a fresh child process.

    Resident memory on the CPU; the allocator's peak on CUDA (:mod:`attnkit.lab.analysis.memory`).
    """
    spec = json.dumps({"case": asdict(case), "method": method, "backends": list(backends)})
    done = subprocess.run([sys.executable, "-m", "attnkit.lab.analysis._memory_child", spec],
                          capture_output=True, text=True, check=True)
    return int(done.stdout.strip().splitlines()[-1])
