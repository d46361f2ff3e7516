"""Threads for the paths made of many operators: one while the machine is oversubscribed.

Every parallel torch operator ends at a barrier of its thread team. When more threads
are runnable than there are cores (other processes busy), a team member that lost its
core holds the others at the barrier until it is scheduled again: a scheduler time slice,
milliseconds, per operator, where the operator itself takes microseconds. A path of
tens of operators per call (the band windows: a few per slab of blocks) then pays tens
of time slices, while torch's fused SDPA kernel (one operator) pays one. Measured on 2
cores with about 9 runnable threads (window +-128, L = 4096, 8 heads, forward): the band
path on 2 threads 1.5-2.3 s, on 1 thread 0.21 s (10 times its quiet time), SDPA with the
dense mask 2.1 s on either.

So :func:`for_many_operators` runs such a path on one thread while the 1-minute load
average exceeds the cores (``os.getloadavg``, the rule GNU OpenMP's dynamic mode,
``OMP_DYNAMIC``, sizes its teams by), and on torch's threads otherwise. The answer does
not depend on it: the same operators run, on fewer threads (the same bits in the tests). The
load average lags (a minute's decay), so the first seconds of a new load run as before.
``torch.set_num_threads`` is process-wide: a program calling attnkit from several Python
threads at once should set one torch thread itself.
"""

from __future__ import annotations

import contextlib
import os

import torch

__all__ = ["oversubscribed", "for_many_operators"]


def oversubscribed() -> bool:
    """Whether the 1-minute load average exceeds the cores (False where the system has no load average)."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return False
    return load > (os.cpu_count() or 1)


@contextlib.contextmanager
def for_many_operators():
    """One torch thread inside while the machine is oversubscribed; the caller's number restored after."""
    threads = torch.get_num_threads()
    if threads > 1 and oversubscribed():
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)
    else:
        yield
