"""The machine a benchmark ran on, and the one measurement of its matmul ceiling.

The ceiling is the rate (GFLOP/s) of large matrix products, the operation attention's
FLOPs are made of: :func:`matmul_rounds` times given products through the one timing
loop, interleaved round by round, optionally beside other calls (a path whose fraction
of the ceiling is wanted: then each round's ceiling is measured under that round's
load). The suite reports the square product per dtype (:func:`ceiling`);
``attnkit bench --roofline`` adds the batched products of attention's block shapes
(:func:`attention_products`).
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple

import torch

from ..analysis.timing import time_once, time_rounds

__all__ = ["machine_info", "Product", "square_product", "attention_products", "matmul_rounds", "matmul_gflops",
           "ceiling"]

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


class Product(NamedTuple):
    """A matrix product to time: a zero-argument call and the FLOPs of one call."""

    call: Callable[[], object]
    flops: float


def square_product(n: int, dtype: torch.dtype = torch.float32, device="cpu") -> Product:
    """``a @ b`` of two ``n x n`` matrices: ``2 n^3`` FLOPs."""
    a, b = (torch.randn(n, n).to(device, dtype) for _ in range(2))
    return Product(lambda: a @ b, 2.0 * n ** 3)


def attention_products(head_dim: int, n: int, device="cpu") -> dict[str, Product]:
    """The square ``mm`` of size ``n`` and the two batched products of a block of 128 queries against 512 keys.

    ``(m, 128, D) @ (m, D, 512)`` (scores) and ``(m, 128, 512) @ (m, 512, D)`` (weights times
    values): the shapes attnkit's block kernels multiply, which run slower than the square product.
    """
    g = torch.Generator().manual_seed(1)
    m = max(1, (1 << 22) // (128 * 512))
    q, kt = torch.randn(m, 128, head_dim, generator=g), torch.randn(m, head_dim, 512, generator=g)
    s, v = torch.randn(m, 128, 512, generator=g), torch.randn(m, 512, head_dim, generator=g)
    q, kt, s, v = (t.to(device) for t in (q, kt, s, v))
    return {f"mm {n}x{n}x{n}": square_product(n, device=device),
            f"bmm ({m}, 128, {head_dim}) @ ({head_dim}, 512)": Product(lambda: torch.bmm(q, kt),
                                                                    2.0 * m * 128 * head_dim * 512),
            f"bmm ({m}, 128, 512) @ (512, {head_dim})": Product(lambda: torch.bmm(s, v),
                                                             2.0 * m * 128 * 512 * head_dim)}


def matmul_rounds(products: Mapping[str, Product], repeats: int = 3, *, warmup: int = 1, best_of: int = 1,
                  beside: Mapping[str, Callable[[], object]] | None = None,
                  device=None) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """``(GFLOP/s of each product per round, seconds of each call beside them per round)``.

    The products and the calls ``beside`` them run interleaved in the same rounds
    (:func:`attnkit.lab.analysis.timing.time_rounds`), so round ``i`` of a call and round
    ``i`` of the ceiling saw the same load. A product's rate in a round is the best of
    ``best_of`` calls made one after the other: one slow call (another process taking
    the core) should not lower a ceiling.
    """
    calls = {f"{name} #{i}": p.call for name, p in products.items() for i in range(best_of)}
    calls.update(beside or {})
    times = time_rounds(calls, repeats, warmup, device=device)
    rates = {name: [p.flops / min(times[f"{name} #{i}"][r] for i in range(best_of)) / 1e9 for r in range(repeats)]
             for name, p in products.items()}
    return rates, {name: times[name] for name in beside or {}}


def matmul_gflops(dtype: torch.dtype = torch.float32, n: int = 2048, threads: int | None = None,
                  seconds: float = 1.0) -> tuple[float, int]:
    """``(GFLOP/s, size)`` of a square matmul of size up to ``n``: the median of the calls that fit in ``seconds``.

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
            product = square_product(size, dtype)
            once, _ = time_once(product.call)  # warm-up, and the cost of one call
            if size * 2 > n or once * 8 > seconds / 2:  # the next size costs 8x: stop if it would not fit
                break
            size *= 2
        repeats = max(3, min(20, int(seconds / max(once, 1e-9))))
        rates, _ = matmul_rounds({"mm": product}, repeats, warmup=0)
    finally:
        torch.set_num_threads(before)
    return statistics.median(rates["mm"]), size


def ceiling(n: int = 2048, seconds: float = 1.0) -> dict:
    """``{dtype: {"1": GFLOP/s at 1 thread, "all": at every thread, "n": size}}`` for float32 and bfloat16."""
    out = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        one, size = matmul_gflops(dtype, n, 1, seconds)
        every, _ = matmul_gflops(dtype, size, None, seconds)
        out[name] = {"1": one, "all": every, "n": size}
    return out
