"""What limits a row that misses its target: the top operators of one call, from torch.profiler."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..analysis.timing import time_once

__all__ = ["top_ops"]


def top_ops(fn: Callable[[], object], backward: bool = False, n: int = 6) -> list[str]:
    """The ``n`` operators with the most self CPU time in one call of ``fn``, as ``"op: ms (share%)"`` lines.

    The first line compares the call's wall time with the operators' total: the
    difference is Python, dispatch and validation overhead.

    Example:
        >>> lines = top_ops(lambda: torch.ones(64, 64) @ torch.ones(64, 64), n=2)
        >>> lines[0].startswith("one call"), any(line.startswith("aten::mm") for line in lines)
        (True, True)
    """
    from torch.profiler import ProfilerActivity, profile

    with torch.set_grad_enabled(backward):
        wall, _ = time_once(fn)  # callers have warmed fn up (layouts, allocator): steady state
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    head = f"one call {wall * 1e3:.1f} ms wall (unprofiled), operators {total / 1e3:.1f} ms"
    return [head] + [f"{e.key}: {e.self_cpu_time_total / 1e3:.1f} ms ({100 * e.self_cpu_time_total / total:.0f}%, "
            f"{e.count} calls)" for e in events[:n]]
