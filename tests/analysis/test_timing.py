"""Interleaved timing and peak memory in a child process (attnkit.analysis.timing), as `attnkit bench` uses them."""

from attnkit.analysis.timing import Case, peak_memory


def test_peak_memory_of_a_call_runs_in_a_child_and_is_positive():
    case = Case(batch=1, heads=2, q_len=512, head_dim=16, mask="causal()", backward=True)
    assert peak_memory(case, "attnkit reference", ("reference",)) > 0


def test_time_interleaved_alternates_the_order_and_reports_every_side():
    from attnkit.analysis.timing import time_interleaved
    order = []
    stats = time_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, repeats=3, warmup=1)
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then rounds reversed every other time
    for median, low, high, runs in stats.values():
        assert low <= median <= high and runs == 3


def test_time_interleaved_cuts_rounds_to_the_budget():
    import time

    from attnkit.analysis.timing import time_interleaved
    stats = time_interleaved({"slow": lambda: time.sleep(0.05)}, repeats=10, warmup=1, budget_s=0.12)
    assert 1 <= stats["slow"][3] <= 3
    assert time_interleaved({"x": lambda: time.sleep(0.05)}, repeats=2, budget_s=0.001)["x"][3] == 1
