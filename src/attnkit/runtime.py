"""Process-level settings that change speed, never the function computed.

On glibc, every large tensor PyTorch frees on the CPU goes back to the OS, and
the next one of that size is page-faulted in afresh: for attention's
temporaries that costs more than the arithmetic (a 32 MB elementwise op takes
~3 ms on a fresh buffer and ~0.2 ms on a reused one on the 2-core machines this
was measured on). :func:`retain_freed_memory` asks glibc to keep freed memory
for reuse. It is process-wide (resident memory stays at its peak), so attnkit
never calls it on import; ``attnkit bench`` does, for both sides of a comparison.

bfloat16 and float16 inputs: torch's fused CPU kernel computes in the input
dtype where the CPU has matmul units for it (AMX, AVX-512-BF16), and its
backward is then fast. Without them (AVX2 machines) a bfloat16 matmul is
emulated, about 40x slower than float32 here, so the fused kernels and the band
windows compute such inputs in float32 and round the output once (more accurate,
never slower); where the units exist, the band windows multiply in the half dtype
with float32 scores and sums (kernels/band.py):
:func:`low_precision_math` chooses, :func:`set_low_precision_math` overrides.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import warnings

import torch

__all__ = ["retain_freed_memory", "low_precision_math", "set_low_precision_math", "native_low_precision"]

_LOW_PRECISION_MODES = ("auto", "native", "float32")
_low_precision_mode = "auto"

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


@functools.cache
def native_low_precision(dtype: torch.dtype) -> bool:
    """Whether this CPU has matmul units for ``dtype`` (bfloat16: AMX or AVX-512-BF16; float16: AMX-FP16)."""
    checks = {torch.bfloat16: ("_is_amx_tile_supported", "_is_avx512_bf16_supported"),
              torch.float16: ("_is_amx_fp16_supported",)}.get(dtype, ())
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)  # private probes: absent = no


def set_low_precision_math(mode: str) -> None:
    """``"auto"`` (default: native where :func:`native_low_precision`), ``"native"`` or ``"float32"``."""
    global _low_precision_mode
    if mode not in _LOW_PRECISION_MODES:
        from .errors import ArgumentError
        raise ArgumentError(f"set_low_precision_math: mode must be one of {_LOW_PRECISION_MODES}; got {mode!r}")
    _low_precision_mode = mode


def low_precision_math(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype torch's fused CPU kernel should compute ``dtype`` inputs in (``dtype`` itself unless it is
    bfloat16/float16 on a CPU without matmul units for it, or the mode says ``"float32"``)."""
    if dtype not in (torch.bfloat16, torch.float16) or device.type != "cpu" or _low_precision_mode == "native":
        return dtype
    if _low_precision_mode == "float32" or not native_low_precision(dtype):
        return torch.float32
    return dtype
