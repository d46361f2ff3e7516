"""Peak memory of a block of work (attnkit.lab.analysis.memory): resident on the CPU, the CUDA allocator's on a GPU."""

import subprocess
import sys

import pytest
import torch

from attnkit.lab.analysis import memory
from attnkit.lab.analysis.memory import peak_bytes, reset_peak

_FRESH_BUFFER = """
import torch
from attnkit.lab.analysis.memory import peak_bytes, reset_peak, resident_bytes
base = reset_peak()
assert abs(base - resident_bytes("VmRSS")) <= 0.05 * base, (base, resident_bytes("VmRSS"))
buffer = torch.ones(16 * 2**20)  # 64 MiB, touched by the fill
del buffer
assert peak_bytes() - base >= 60 * 2**20, peak_bytes() - base
assert peak_bytes("cpu") == resident_bytes("VmHWM")
"""


def test_peak_counts_a_buffer_allocated_and_freed_after_the_reset():
    # In a fresh process, as the tour measures: in the long-lived test process the allocator may hand the buffer
    # memory that is already resident, which is no growth of the high-water mark.
    run = subprocess.run([sys.executable, "-c", _FRESH_BUFFER], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr


class _FakeAllocator:
    """torch.cuda's memory counters on a machine without a GPU: 100 bytes held, a peak of 700 since the reset."""

    def __init__(self, monkeypatch):
        self.log = []
        for name, value in (("synchronize", None), ("reset_peak_memory_stats", None), ("memory_allocated", 100),
                            ("max_memory_allocated", 700)):
            monkeypatch.setattr(torch.cuda, name, lambda device=None, n=name, v=value: self.log.append((n, device))
                                or v)


def test_on_cuda_the_peak_is_the_allocators_not_the_processes(monkeypatch):
    fake = _FakeAllocator(monkeypatch)
    monkeypatch.setattr(memory, "resident_bytes", lambda field="VmRSS": pytest.fail("read resident memory"))
    base = reset_peak("cuda:1")
    assert base == 100 and peak_bytes(torch.device("cuda", 1)) - base == 600
    names = [n for n, _ in fake.log]
    assert names.index("synchronize") < names.index("reset_peak_memory_stats") < names.index("memory_allocated")
    assert {d for _, d in fake.log} == {torch.device("cuda", 1)}
