"""The one timing loop (attnkit.lab.analysis.timing) and the default table of `attnkit bench`: peak memory in
a child."""

import time
import types

import pytest
import torch

from attnkit.lab.analysis import timing
from attnkit.lab.analysis.timing import Case, peak_memory, time_interleaved, time_once, time_rounds


def test_peak_memory_of_a_call_runs_in_a_child_and_is_positive():
    case = Case(batch=1, heads=2, q_len=512, head_dim=16, mask="causal()", backward=True)
    assert peak_memory(case, "attnkit reference", ("reference",)) > 0


def test_time_interleaved_alternates_the_order_and_reports_every_side():
    order = []
    stats = time_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, repeats=3, warmup=1)
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then rounds reversed every other time
    for median, low, high, runs in stats.values():
        assert low <= median <= high and runs == 3


def test_time_interleaved_cuts_rounds_to_the_budget():
    stats = time_interleaved({"slow": lambda: time.sleep(0.05)}, repeats=10, warmup=1, budget_s=0.12)
    assert 1 <= stats["slow"][3] <= 3
    assert time_interleaved({"x": lambda: time.sleep(0.05)}, repeats=2, budget_s=0.001)["x"][3] == 1


def test_a_sample_of_several_calls_is_their_mean_and_before_runs_untimed_before_each(monkeypatch):
    clock = [0.0]  # a fake clock: each call takes 2 s, each `before` 100 s
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    events = []

    def call():
        events.append("a")
        clock[0] += 2.0

    def before():
        events.append("before")
        clock[0] += 100.0

    times = time_rounds({"a": call}, repeats=2, warmup=0, calls=3, before=before)
    assert events == ["before", "a", "a", "a", "before", "a", "a", "a"]
    assert times == {"a": [2.0, 2.0]}  # per call, and `before` is outside the clock


def test_time_once_returns_the_result_of_its_single_call():
    calls = []
    seconds, result = time_once(lambda: calls.append(1) or "built")
    assert result == "built" and calls == [1] and seconds >= 0


class _FakeCuda:
    """Stands in for torch.cuda.synchronize on a machine without a GPU; records the device of each call."""

    def __init__(self):
        self.calls = []

    def __call__(self, device=None):
        self.calls.append(torch.device(device))


@pytest.mark.parametrize("device", ["cuda", "cuda:1", torch.device("cuda", 0)])
def test_on_cuda_every_timed_sample_waits_for_the_device_before_and_after(device, monkeypatch):
    sync = _FakeCuda()
    monkeypatch.setattr(torch.cuda, "synchronize", sync)
    order = []
    times = time_rounds({"a": lambda: order.append(len(sync.calls))}, repeats=2, warmup=1, device=device)
    assert len(times["a"]) == 2
    assert len(sync.calls) == 2 * 3  # warm-up and two samples, each between two synchronisations
    assert order == [1, 3, 5]  # every call ran after a synchronisation and before the next one
    assert all(d == torch.device(device) for d in sync.calls)


@pytest.mark.parametrize("device", [None, "cpu", torch.device("cpu"), "meta"])
def test_on_the_cpu_nothing_is_synchronised(device, monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("synchronised a CPU run"))
    assert timing.synchronizer(device) is None
    assert len(time_rounds({"a": lambda: None}, repeats=2, device=device)["a"]) == 2


def test_case_inputs_live_on_the_case_device():
    q, k, v = Case(batch=2, heads=3, q_len=5, kv_len=7, head_dim=11, dtype="float64", device="meta").inputs()
    assert {t.device.type for t in (q, k, v)} == {"meta"} and q.dtype == torch.float64
    assert q.shape == (2, 3, 5, 11) and v.shape == (2, 3, 7, 11)
