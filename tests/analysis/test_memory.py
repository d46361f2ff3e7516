"""Peak resident memory of a block of work (attnkit.analysis.memory), used by the benchmarks and `attnkit bench`."""

import torch

from attnkit.analysis.memory import reset_peak, resident_bytes


def test_peak_counts_a_buffer_allocated_and_freed_after_the_reset():
    reset_peak()
    before = resident_bytes("VmRSS")
    buffer = torch.ones(16 * 2**20)  # 64 MiB, touched by the fill
    del buffer
    assert resident_bytes("VmHWM") - before >= 60 * 2**20
