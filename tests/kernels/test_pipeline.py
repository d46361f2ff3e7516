"""The pipeline's units: many-operator paths split into runs of heads taken by threads, each operator on one."""

from __future__ import annotations

import threading

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.kernels import pipeline
from tests.helpers import oracle


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_unit_count_is_one_on_one_thread_or_for_small_work_else_two_per_thread_at_most_one_per_head(two_threads):
    assert pipeline.unit_count(8, pipeline.UNIT_WORK) == 4
    assert pipeline.unit_count(3, pipeline.UNIT_WORK) == 3
    assert pipeline.unit_count(8, pipeline.UNIT_WORK - 1) == 1
    torch.set_num_threads(1)
    assert pipeline.unit_count(8, 1 << 40) == 1


def _run(units, work):
    """Every unit of ``units`` through ``work(u)``, as a path runs them: the caller's share inside ``helping``."""
    def share():
        for u in units.take():
            work(u)
    with units.helping(share):
        share()


def test_every_unit_runs_once_on_the_callers_threads_each_operator_on_one(two_threads):
    seen = []
    _run(pipeline.Units(5), lambda u: seen.append((u, threading.get_ident(), torch.get_num_threads(),
                                                   torch.is_grad_enabled())))
    assert sorted(s[0] for s in seen) == list(range(5)) and len({s[1] for s in seen}) <= 2
    assert all(s[2] == 1 and s[3] for s in seen)  # one torch thread, the caller's grad mode, in every unit
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("failing", [0, 3])
def test_a_units_error_is_raised_in_the_caller_with_its_threads_back(two_threads, failing):
    def work(u):
        if u == failing:
            raise ValueError(f"unit {u}")
    with pytest.raises(ValueError, match=f"unit {failing}"):
        _run(pipeline.Units(6), work)
    assert torch.get_num_threads() == 2


def test_the_caller_runs_every_unit_when_no_thread_can_start(monkeypatch, two_threads):
    def refuse(self):
        raise RuntimeError("can't start new thread")
    monkeypatch.setattr(threading.Thread, "start", refuse)
    seen = []
    _run(pipeline.Units(4), lambda u: seen.append((u, threading.get_ident(), torch.get_num_threads())))
    assert seen == [(u, threading.get_ident(), 1) for u in range(4)] and torch.get_num_threads() == 2


def test_units_run_in_inference_mode_and_without_grad_where_the_caller_does(two_threads):
    with torch.inference_mode():
        out, modes = torch.zeros(4), []

        def work(u):
            out[u] = 1.0  # an inference tensor: written in place only in inference mode
            modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        _run(pipeline.Units(4), work)
    assert out.tolist() == [1.0] * 4 and modes == [(True, False)] * 4


def test_one_thread_runs_every_unit_in_order_on_the_caller():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        seen = []
        _run(pipeline.Units(3), lambda u: seen.append((u, threading.get_ident())))
    finally:
        torch.set_num_threads(before)
    assert seen == [(u, threading.get_ident()) for u in range(3)]


def test_band_windows_in_units_equal_the_float64_reference_and_one_threads_bits(monkeypatch, two_threads):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 6, 300, 16, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = masks.sliding_window(40, 20)
    assert attnkit.explain(q, k, v, mask=mask).path == "band-windows"
    monkeypatch.setattr(pipeline, "UNIT_WORK", 0)  # this small call in units too
    counts, real = [], pipeline.Units

    def spy(count):
        counts.append(count)
        return real(count)
    monkeypatch.setattr(attnkit.kernels.band, "Units", spy)
    runs = []
    for threads in (2, 1):
        torch.set_num_threads(threads)
        out = attnkit.attention(q, k, v, mask=mask)
        runs.append((out, *torch.autograd.grad(out.square().sum(), (q, k, v))))
    assert counts == [4, 4, 1, 1]  # forward and backward in four units of heads, then one
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
    exp = oracle(q, k, v, mask=mask, differentiable=True)  # the independent float64 attention
    for a, b in zip(runs[0], (exp, *torch.autograd.grad(exp.square().sum(), (q, k, v))), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_band_window_gradients_have_the_same_bits_at_one_two_and_three_threads_for_heads_not_split_evenly(
        monkeypatch):
    # the units of 2 and 3 threads hold 2 or 3 of the 10 heads (B = 2, H = 5): the order in which the overlapping
    # windows' gradients are added into dK and dV must not depend on how many heads a unit holds
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 5, 300, 16, generator=g, requires_grad=True) for _ in range(3))
    mask = masks.sliding_window(40, 20)
    assert attnkit.explain(q, k, v, mask=mask).path == "band-windows"
    monkeypatch.setattr(pipeline, "UNIT_WORK", 0)  # this small call in units too
    before, runs = torch.get_num_threads(), []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            out = attnkit.attention(q, k, v, mask=mask)
            runs.append((out, *torch.autograd.grad(out.square().sum(), (q, k, v))))
    finally:
        torch.set_num_threads(before)
    for other in runs[1:]:
        for what, a, b in zip(("out", "dq", "dk", "dv"), runs[0], other, strict=True):
            assert torch.equal(a, b), what
    exp = oracle(q.double(), k.double(), v.double(), mask=mask)
    torch.testing.assert_close(runs[0][0].double(), exp, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_grouped_key_gradients_are_summed_over_their_query_heads_before_rounding(dtype):
    """upcast_inputs casts k, v before repeating their heads: a half-precision key's gradient is the float32 sum
    over its query heads, rounded once (the same bits as the float32 call's gradient rounded)."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, h, 48, 16, generator=g).to(dtype) for h in (8, 2, 2))
    dout = torch.randn(2, 8, 48, 16, generator=g).to(dtype)

    def grads(*inputs):
        inputs = [t.clone().requires_grad_() for t in inputs]
        out = attnkit.attention(*inputs, mask=masks.causal(), backend="reference")
        return torch.autograd.grad(out, inputs, dout.to(out.dtype))  # the same values on both calls

    half, full = grads(q, k, v), grads(q.float(), k.float(), v.float())
    for got, want in zip(half[1:], full[1:], strict=True):
        assert got.dtype == dtype
        assert torch.equal(got, want.to(dtype))


def test_a_workspace_buffer_made_under_inference_mode_is_made_anew_outside_it():
    """Buffers made under ``torch.inference_mode`` are inference tensors, read-only outside it: a later call outside
    (a decoding step over scattered pages, or over selected keys) got "Inplace update to inference tensor outside
    InferenceMode"; such a buffer is replaced, and kept while inference mode is on."""
    from attnkit.kernels.pipeline import Workspace

    space = Workspace(torch.zeros(1))
    with torch.inference_mode():
        inside = space.take("rows", 4, 3)
        assert inside.is_inference() and space.take("rows", 2, 3).data_ptr() == inside.data_ptr()
    outside = space.take("rows", 4, 3)
    assert not outside.is_inference()
    outside.fill_(1.0)  # writable
    with torch.inference_mode():
        assert space.take("rows", 4, 3).data_ptr() == outside.data_ptr()  # a normal buffer serves inference mode
    g = torch.Generator().manual_seed(0)
    k_pool, v_pool = torch.randn(40, 16, 2, 16, generator=g), torch.randn(40, 16, 2, 16, generator=g)
    table, used = torch.randperm(40, generator=g)[:28].view(2, 14), torch.tensor([200, 137])
    q = torch.randn(2, 4, 1, 16, generator=g)
    with torch.inference_mode():
        first = attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=used, mask=masks.causal())
    assert torch.equal(first, attnkit.attention(q, k_pool, v_pool, block_table=table, seqused_k=used,
                                                mask=masks.causal()))
