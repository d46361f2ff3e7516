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


def test_time_interleaved_alternates_the_order_and_reports_every_side():
    from attnkit.analysis.bench import time_interleaved
    order = []
    stats = time_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, repeats=3, warmup=1)
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then rounds reversed every other time
    for median, low, high, runs in stats.values():
        assert low <= median <= high and runs == 3


def test_time_interleaved_cuts_rounds_to_the_budget():
    import time

    from attnkit.analysis.bench import time_interleaved
    stats = time_interleaved({"slow": lambda: time.sleep(0.05)}, repeats=10, warmup=1, budget_s=0.12)
    assert 1 <= stats["slow"][3] <= 3
    assert time_interleaved({"x": lambda: time.sleep(0.05)}, repeats=2, budget_s=0.001)["x"][3] == 1


def test_machine_info_and_matmul_ceiling():
    from attnkit.analysis.bench_machine import machine_info, matmul_gflops
    info = machine_info()
    assert info["torch"] == torch.__version__ and info["threads"] == torch.get_num_threads()
    assert {"cpu", "cores", "flags", "date", "torch_cpu_capability"} <= info.keys()
    gflops, size = matmul_gflops(torch.float32, n=64, threads=1, seconds=0.05)
    assert gflops > 0 and size == 64


def test_top_ops_names_the_operators_of_a_call():
    from attnkit.analysis.bench_profile import top_ops
    a = torch.randn(32, 32, requires_grad=True)
    lines = top_ops(lambda: (a @ a).exp().sum(), backward=True, n=20)
    assert lines[0].startswith("one call")
    assert any(line.startswith("aten::mm") for line in lines) and any("aten::exp" in line for line in lines)


def test_side_peak_counts_the_dense_mask_a_baseline_holds():
    """SDPA given a dense (L, L) bool mask holds it: at L = 2048 that alone is 4 MiB (built after the reset)."""
    from attnkit.analysis.bench_child import side_peak
    from attnkit.analysis.bench_rows import Spec
    spec = Spec(2, "w", Case(batch=1, heads=1, q_len=2048, head_dim=8, mask="sliding_window(8, 8)"), ("sdpa-mask",))
    assert side_peak(spec, "sdpa-mask") > 4 * 2**20
    assert side_peak(spec, "no such side") is None  # a failing child is reported as None, not raised
