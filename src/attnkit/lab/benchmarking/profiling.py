"""What limits a row that misses its target: the top operators of one call, from torch.profiler."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Callable, Iterator

import torch

from ..analysis.timing import time_once

__all__ = ["top_ops", "profiled"]


def top_ops(fn: Callable[[], object], backward: bool = False, n: int = 6) -> list[str]:
    """The ``n`` operators with the most self CPU time in one call of ``fn``, as ``"op: ms (share%)"`` lines.

    The first line compares the call's wall time with the operators' total: the
    difference is Python, dispatch and validation overhead.

    Example:
        >>> lines = top_ops(lambda: torch.ones(64, 64) @ torch.ones(64, 64), n=2)
        >>> lines[0].startswith("one call"), any(line.startswith("aten::mm") for line in lines)
        (True, True)
    """
    with torch.set_grad_enabled(backward):
        wall, _ = time_once(fn)  # callers have warmed fn up (layouts, allocator): steady state
        with profiled() as prof:
            fn()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    head = f"one call {wall * 1e3:.1f} ms wall (unprofiled), operators {total / 1e3:.1f} ms"
    return [head] + [f"{e.key}: {e.self_cpu_time_total / 1e3:.1f} ms ({100 * e.self_cpu_time_total / total:.0f}%, "
            f"{e.count} calls)" for e in events[:n]]


# Lines torch's profiler library (Kineto) writes to the process's stderr at each start and stop, whatever its log level.
_PROFILER_NOISE = ("USDT:", "STAGE:")


@contextlib.contextmanager
def profiled() -> Iterator[torch.profiler.profile]:
    """``torch.profiler.profile`` of the CPU, with the trace lines its C++ library prints to stderr held back.

    Kineto writes ``USDT: ... profiler_start`` lines to file descriptor 2 on every start and stop; they would
    interleave with a command's table. Descriptor 2 goes to a temporary file while the profiler runs, and
    every other line it received is written back to stderr afterwards.
    """
    from torch.profiler import ProfilerActivity, profile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                yield prof
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines(keepends=True)
                    if not line.startswith(_PROFILER_NOISE)]
            if kept:
                sys.stderr.write("".join(kept))
