"""The top operators shown for a missed target (attnkit.lab.benchmarking.profiling)."""

import torch

from attnkit.lab.benchmarking.profiling import top_ops


def test_top_ops_names_the_operators_of_a_call():
    a = torch.randn(32, 32, requires_grad=True)
    lines = top_ops(lambda: (a @ a).exp().sum(), backward=True, n=20)
    assert lines[0].startswith("one call")
    assert any(line.startswith("aten::mm") for line in lines) and any("aten::exp" in line for line in lines)


def test_the_profilers_trace_lines_stay_out_of_stderr_and_other_lines_come_through(capfd):
    import os

    from attnkit.lab.benchmarking.profiling import profiled

    with profiled():
        torch.ones(8, 8).sum()
        os.write(2, b"USDT: profiler noise\nkept line\n")
    err = capfd.readouterr().err
    assert "USDT" not in err and "STAGE" not in err and "kept line" in err
    top_ops(lambda: torch.ones(8, 8) @ torch.ones(8, 8), n=1)
    assert "USDT" not in capfd.readouterr().err
