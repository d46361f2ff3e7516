"""The machine section of the suite: CPU, versions and the measured matmul ceiling (benchmarks.harness.machine)."""

import torch
from attnkit.benchmarking.machine import machine_info, matmul_gflops


def test_machine_info_and_matmul_ceiling():
    info = machine_info()
    assert info["torch"] == torch.__version__ and info["threads"] == torch.get_num_threads()
    assert {"cpu", "cores", "flags", "date", "torch_cpu_capability"} <= info.keys()
    gflops, size = matmul_gflops(torch.float32, n=64, threads=1, seconds=0.05)
    assert gflops > 0 and size == 64
