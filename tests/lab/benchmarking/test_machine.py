"""The machine a benchmark runs on and the one matmul ceiling measurement (attnkit.lab.benchmarking.machine)."""

import pytest
import torch

from attnkit.lab.benchmarking import machine
from attnkit.lab.benchmarking.machine import Product, attention_products, machine_info, matmul_gflops, matmul_rounds


def test_machine_info_and_matmul_ceiling():
    info = machine_info()
    assert info["torch"] == torch.__version__ and info["threads"] == torch.get_num_threads()
    assert {"cpu", "cores", "flags", "date", "torch_cpu_capability"} <= info.keys()
    gflops, size = matmul_gflops(torch.float32, n=64, threads=1, seconds=0.05)
    assert gflops > 0 and size == 64


def test_a_rate_per_round_is_the_best_of_its_calls_and_calls_beside_share_the_rounds(monkeypatch):
    seen = []

    def fake_rounds(fns, repeats, warmup, device=None):
        seen.append(list(fns))
        times = {"mm #0": [2.0, 1.0], "mm #1": [1.0, 4.0], "mm #2": [4.0, 2.0], "path": [0.5, 0.25]}
        return {name: times[name] for name in fns}
    monkeypatch.setattr(machine, "time_rounds", fake_rounds)
    rates, beside = matmul_rounds({"mm": Product(lambda: None, 3e9)}, 2, best_of=3, beside={"path": lambda: None})
    assert seen == [["mm #0", "mm #1", "mm #2", "path"]]  # one loop: the ceiling and the path interleaved
    assert rates == {"mm": [3.0, 3.0]} and beside == {"path": [0.5, 0.25]}


def test_attention_products_count_their_flops():
    products = attention_products(head_dim=8, n=16)
    assert next(iter(products)) == "mm 16x16x16" and products["mm 16x16x16"].flops == 2 * 16**3
    for name, (call, flops) in products.items():
        out = call()
        inner = 8 if "@ (8, 512)" in name else 512 if "@ (512, 8)" in name else 16  # the summed dimension
        assert flops == pytest.approx(2 * out.numel() * inner), name
