"""Peak memory of a block of work: the CUDA allocator's on a GPU, the resident size (Linux) on the CPU.

``base = reset_peak(device)`` sets the high-water mark back to the current level and
returns that level; ``peak_bytes(device) - base`` is then the peak the work in between
added (imports and inputs made before do not count). On the CPU the level is the
resident size read from ``/proc/self/status`` (``VmRSS``; the mark is ``VmHWM``, reset
through ``/proc/self/clear_refs``): tensors there live in the process's memory. On CUDA
the resident size says nothing about the device, so the level is
``torch.cuda.memory_allocated`` and the mark ``torch.cuda.max_memory_allocated``, reset
by ``torch.cuda.reset_peak_memory_stats``.
"""

from __future__ import annotations

__all__ = ["reset_peak", "peak_bytes", "resident_bytes"]


def resident_bytes(field: str = "VmRSS") -> int:
    """``VmRSS`` (now) or ``VmHWM`` (peak since the last reset) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"{field} not in /proc/self/status")


def _cuda(device):
    """``device`` as a ``torch.device`` when it is a CUDA device, else None (the CPU's resident memory)."""
    if device is None:
        return None
    import torch

    device = torch.device(device)
    return device if device.type == "cuda" else None


def reset_peak(device=None) -> int:
    """Reset the peak on ``device`` (default: the CPU) to the current level; return that level in bytes."""
    cuda = _cuda(device)
    if cuda is None:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return resident_bytes("VmRSS")
    import torch

    torch.cuda.synchronize(cuda)  # work queued before the reset belongs to the level, not the peak
    torch.cuda.reset_peak_memory_stats(cuda)
    return torch.cuda.memory_allocated(cuda)


def peak_bytes(device=None) -> int:
    """The peak level in bytes on ``device`` since the last :func:`reset_peak`."""
    cuda = _cuda(device)
    if cuda is None:
        return resident_bytes("VmHWM")
    import torch

    torch.cuda.synchronize(cuda)
    return torch.cuda.max_memory_allocated(cuda)
