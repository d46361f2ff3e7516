"""Peak resident memory of a block of work, read from Linux's ``/proc/self/status``.

``reset_peak()`` sets the high-water mark (VmHWM) back to the current resident
size through ``/proc/self/clear_refs``, so a later ``resident_bytes("VmHWM")``
minus the ``resident_bytes("VmRSS")`` read right after the reset is the peak
that the work in between added (imports and inputs made before do not count).
"""

from __future__ import annotations

__all__ = ["reset_peak", "resident_bytes"]


def resident_bytes(field: str = "VmRSS") -> int:
    """``VmRSS`` (now) or ``VmHWM`` (peak since the last reset) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> None:
    """Reset the peak resident size (VmHWM) to the current one (Linux)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
