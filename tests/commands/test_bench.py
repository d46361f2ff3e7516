"""`attnkit bench --compare`: any row of the benchmark suite from the command line, and its option errors."""

from __future__ import annotations

import pytest

from attnkit import cli
from attnkit.commands import bench


def test_bench_compare_runs_a_suite_row(capsys):
    assert cli.main(["bench", "--compare", "sdpa-mask,sdpa", "--q-len", "48", "--heads", "2", "--head-dim", "8",
                     "--mask", "causal() & sliding_window(4, 0)", "--repeats", "1", "--backward", "yes",
                     "--goal", "1000"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "torch sdpa (dense bool mask)" in x)
    assert "| PASS |" in line and "fwd+bwd" in line
    assert float(line.split("|")[11]) < 1e-5  # max abs diff column


def test_bench_compare_bias_and_additive(capsys):
    assert cli.main(["bench", "--compare", "sdpa-bias", "--bias", "relpos", "--q-len", "16", "--heads", "2",
                     "--head-dim", "8", "--repeats", "1", "--backward", "no"]) == 0
    assert "torch sdpa (dense float bias)" in capsys.readouterr().out
    assert cli.main(["bench", "--compare", "additive", "--batch", "2", "--q-len", "5", "--kv-len", "7",
                     "--head-dim", "11", "--repeats", "1", "--backward", "no"]) == 0
    assert "broadcast-then-tanh" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [["--compare", "nope"], ["--compare", "additive,sdpa"], ["--bias", "nope"]])
def test_bench_rejects_bad_options(bad, capsys):
    with pytest.raises(SystemExit) as err:
        cli.build_parser().parse_args(["bench", *bad])
    assert err.value.code == 2
    assert "bench" in capsys.readouterr().err


def test_compare_without_the_harness_is_a_clear_usage_error(monkeypatch, tmp_path, capsys):
    """From an installed package (no benchmarks/ next to src/) --compare says where the harness is."""
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    with pytest.raises(SystemExit) as err:
        cli.build_parser().parse_args(["bench", "--compare", "sdpa"])
    assert err.value.code == 2
    assert "benchmarks/harness/" in capsys.readouterr().err


def test_bench_roofline_runs_the_ceiling_section_with_the_given_sizes(monkeypatch, capsys):
    """``--roofline L...`` hands the lengths, --heads, --head-dim and --repeats to benchmarks/ceiling.py."""
    from benchmarks import ceiling

    seen = []
    monkeypatch.setattr(ceiling, "run", lambda cfg, log: seen.append(cfg) or ([], {"mm": 1.0}))
    assert cli.main(["bench", "--roofline", "512", "1024", "--heads", "2", "--head-dim", "16", "--repeats", "3"]) == 0
    assert seen[0].lengths == (512, 1024) and (seen[0].heads, seen[0].head_dim, seen[0].rounds) == (2, 16, 3)
    out = capsys.readouterr().out
    assert "attnkit bench --roofline 512 1024 --repeats 3" in out and "| path | mask | L |" in out
    assert cli.main(["bench", "--roofline", "--repeats", "2"]) == 0
    assert seen[1].lengths == ceiling.Config.lengths
