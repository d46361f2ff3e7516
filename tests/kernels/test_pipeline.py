"""The pipeline's thread rule: one torch thread for many-operator paths on an oversubscribed machine."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.kernels import band, pipeline


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _load(monkeypatch, value):
    monkeypatch.setattr(pipeline.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(pipeline.os, "getloadavg", lambda: (value, value, value))


@pytest.mark.parametrize("load, inside", [(9.0, 1), (1.5, 2)])
def test_one_thread_inside_only_while_the_load_exceeds_the_cores(monkeypatch, two_threads, load, inside):
    _load(monkeypatch, load)
    with pipeline.for_many_operators():
        seen = torch.get_num_threads()
    assert seen == inside and torch.get_num_threads() == 2


def test_the_callers_threads_come_back_after_an_error(monkeypatch, two_threads):
    _load(monkeypatch, 9.0)
    with pytest.raises(RuntimeError, match="inside"), pipeline.for_many_operators():
        raise RuntimeError("inside")
    assert torch.get_num_threads() == 2


def test_a_system_without_a_load_average_is_not_oversubscribed(monkeypatch):
    def missing():
        raise OSError("no load average")
    monkeypatch.setattr(pipeline.os, "getloadavg", missing)
    assert not pipeline.oversubscribed()


def test_band_windows_give_the_same_bits_forward_and_backward_on_a_busy_machine(monkeypatch, two_threads):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 600, 16, generator=g, requires_grad=True) for _ in range(3))
    mask = masks.sliding_window(40, 40)
    assert attnkit.explain(q, k, v, mask=mask).path == "band-windows"
    runs, seen = [], []
    real = band.slabs

    def slabs(*args, **kwargs):  # the threads the slabs' operators run on
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)
    monkeypatch.setattr(band, "slabs", slabs)
    for load in (1.0, 9.0):
        _load(monkeypatch, load)
        out = attnkit.attention(q, k, v, mask=mask)
        runs.append((out, *torch.autograd.grad(out.square().sum(), (q, k, v))))
    assert seen == [2, 2, 1, 1]  # forward and backward, quiet then busy
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
