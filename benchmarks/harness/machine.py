"""The machine a benchmark ran on, and its measured matmul ceiling (issue 7, target 7)."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from pathlib import Path

import torch

__all__ = ["machine_info", "matmul_gflops", "ceiling"]

_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")


def machine_info() -> dict:
    """CPU model and vector flags (``/proc/cpuinfo``), cores, torch version and threads, date."""
    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")()
    return {"cpu": model, "cores": os.cpu_count(), "flags": [f for f in _FLAGS if f in flags],
            "torch": torch.__version__, "torch_cpu_capability": capability, "threads": torch.get_num_threads(),
            "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc)
            .strftime("%Y-%m-%d %H:%M UTC")}


def matmul_gflops(dtype: torch.dtype = torch.float32, n: int = 2048, threads: int | None = None,
                  seconds: float = 1.0) -> tuple[float, int]:
    """``(GFLOP/s, size)`` of a square matmul of size up to ``n``, median of the calls that fit in ``seconds``.

    The size grows from 256 (doubling) while one call stays well under ``seconds``,
    so a dtype without hardware support (bf16 on a CPU without AVX-512-BF16/AMX can
    run at under 1 GFLOP/s) is measured at a size that fits, not for minutes.
    """
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        size = min(256, n)
        while True:
            a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
            start = time.perf_counter()
            a @ b  # warm-up, and the cost of one call
            once = time.perf_counter() - start
            if size * 2 > n or once * 8 > seconds / 2:  # the next size costs 8x: stop if it would not fit
                break
            size *= 2
        times = []
        deadline = time.perf_counter() + seconds
        while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 20):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(before)
    return 2 * size**3 / statistics.median(times) / 1e9, size


def ceiling(n: int = 2048, seconds: float = 1.0) -> dict:
    """``{dtype: {"1": GFLOP/s at 1 thread, "all": at every thread, "n": size}}`` for float32 and bfloat16."""
    out = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        one, size = matmul_gflops(dtype, n, 1, seconds)
        every, _ = matmul_gflops(dtype, size, None, seconds)
        out[name] = {"1": one, "all": every, "n": size}
    return out
