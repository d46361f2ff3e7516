"""Process-level settings that change speed, never results.

On glibc, every large tensor PyTorch frees on the CPU goes back to the OS, and
the next one of that size is page-faulted in afresh: for attention's
temporaries that costs more than the arithmetic (a 32 MB elementwise op takes
~3 ms on a fresh buffer and ~0.2 ms on a reused one on the 2-core machines this
was measured on). :func:`retain_freed_memory` asks glibc to keep freed memory
for reuse. It is process-wide (resident memory stays at its peak), so attnkit
never calls it on import; ``attnkit bench`` does, for both sides of a comparison.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import warnings

__all__ = ["retain_freed_memory"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def retain_freed_memory(max_block_bytes: int = 1 << 30) -> bool:
    """Keep freed heap memory for reuse (glibc ``mallopt``). Returns True if applied.

    Blocks up to ``max_block_bytes`` come from the heap instead of fresh ``mmap``
    calls, and the heap is not trimmed back to the OS.
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        ok = libc.mallopt(_M_MMAP_THRESHOLD, int(max_block_bytes)) == 1
        ok = ok and libc.mallopt(_M_TRIM_THRESHOLD, int(2 * max_block_bytes)) == 1
    except (OSError, AttributeError):
        ok = False
    if not ok:
        warnings.warn("retain_freed_memory: mallopt is not available here (not glibc); nothing changed",
                      RuntimeWarning, stacklevel=2)
    return ok
