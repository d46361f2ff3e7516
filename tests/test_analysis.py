"""Peak-memory measurement used by the benchmarks and `attnkit bench --memory`."""

import torch

from attnkit.analysis.bench import Case, peak_memory
from attnkit.analysis.memory import reset_peak, resident_bytes


def test_peak_counts_a_buffer_allocated_and_freed_after_the_reset():
    reset_peak()
    before = resident_bytes("VmRSS")
    buffer = torch.ones(16 * 2**20)  # 64 MiB, touched by the fill
    del buffer
    assert resident_bytes("VmHWM") - before >= 60 * 2**20


def test_peak_memory_of_a_call_runs_in_a_child_and_is_positive():
    case = Case(batch=1, heads=2, q_len=512, head_dim=16, mask="causal()", backward=True)
    assert peak_memory(case, "attnkit reference", ("reference",)) > 0
