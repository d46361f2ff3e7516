"""lab/benchmarking/distributed.py and ``attnkit bench --distributed``: the table, the command line, one real run
(slow).
"""

from __future__ import annotations

import pytest

from attnkit.lab import cli
from attnkit.lab.benchmarking import distributed as bench

ROW = {"scheme": "ring", "layout": "zigzag", "ms": 12.345, "forward_bytes": 3072, "backward_bytes": 7168,
       "formula_forward": 3072, "formula_backward": 7168}


def test_rows_table_shows_time_and_bytes_against_the_formula():
    spec = bench.Spec(procs=3, length=96, heads=6, head_dim=8, mask="causal()", backward=True)
    lines = bench.rows_table(spec, [ROW, {**ROW, "backward_bytes": None, "formula_backward": None}])
    assert lines[0].startswith("forward+backward, W=3 gloo processes") and "L=96" in lines[0] and "causal()" in lines[0]
    assert lines[4] == "| ring | zigzag | 12.3 | 3 (3) | 7 (7) |"
    assert lines[5].endswith("| - (-) |")


def test_command_line_builds_the_spec_it_is_asked_for(monkeypatch, capsys):
    seen, told = [], []

    def measure(spec, progress=None):
        seen.append(spec)
        for scheme, layout in bench.pairs(spec):
            progress(f"{scheme} {layout}")
            told.append(scheme)
        return [ROW]
    monkeypatch.setattr(bench, "measure", measure)
    assert cli.main(["bench", "--distributed", "--procs", "3", "--q-len", "96", "--heads", "6", "--head-dim", "8",
                     "--mask", "causal()", "--backward", "both", "--repeats", "2"]) == 0
    assert [s.backward for s in seen] == [False, True]
    assert seen[0] == bench.Spec(procs=3, batch=1, heads=6, length=96, head_dim=8, dtype="float32", mask="causal()",
                                 backward=False, repeats=2, threads=1)
    out = capsys.readouterr()
    assert "| ring | zigzag | 12.3 |" in out.out
    rows = 2 * len(bench.pairs(seen[0]))
    assert len(told) == rows and f"attnkit bench --distributed: {rows} rows of 4 calls each on 3 processes; about" \
        in out.err  # the estimate comes before the first row


def test_the_estimate_grows_with_the_work_asked_for():
    small = bench.Spec(procs=2, length=1024, head_dim=32, repeats=3)
    assert bench.estimate_seconds(small) > 2 * bench.START_SECONDS
    assert bench.estimate_seconds(bench.Spec(procs=2, length=2048, head_dim=32, repeats=3)) > \
        3 * (bench.estimate_seconds(small) - 2 * bench.START_SECONDS)
    assert bench.estimate_seconds(bench.Spec(procs=2, length=1024, head_dim=32, repeats=3, backward=False)) < \
        bench.estimate_seconds(small)
    assert len(bench.pairs(bench.Spec(procs=4, heads=6))) == len(bench.pairs(bench.Spec(procs=4, heads=8))) - 2


@pytest.mark.slow
def test_a_real_run_counts_the_bytes_its_formula_gives():
    spec = bench.Spec(procs=2, length=32, heads=2, head_dim=4, mask="causal()", repeats=1)
    told = []
    rows = bench.measure(spec, progress=told.append)
    assert len(told) == len(rows) == len(bench.pairs(spec))  # one progress step per row, as rank 0 finishes it
    assert {(r["scheme"], r["layout"]) for r in rows} == {(s, lay) for s in ("ring", "ulysses", "allgather", "usp")
                                                         for lay in ("contiguous", "zigzag")}
    for r in rows:
        assert (r["forward_bytes"], r["backward_bytes"]) == (r["formula_forward"], r["formula_backward"])
        assert r["ms"] > 0
