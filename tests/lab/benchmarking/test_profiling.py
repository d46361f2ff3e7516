"""The top operators shown for a missed target (attnkit.lab.benchmarking.profiling)."""

import torch

from attnkit.lab.benchmarking.profiling import top_ops


def test_top_ops_names_the_operators_of_a_call():
    a = torch.randn(32, 32, requires_grad=True)
    lines = top_ops(lambda: (a @ a).exp().sum(), backward=True, n=20)
    assert lines[0].startswith("one call")
    assert any(line.startswith("aten::mm") for line in lines) and any("aten::exp" in line for line in lines)
