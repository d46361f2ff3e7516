"""`attnkit bench --models`: the whole-model rows of BENCHMARKS.md from the command line (tiny sizes, not timed)."""

from __future__ import annotations

import pytest

from attnkit.lab import cli

TINY = ("batch=2,length=12,window_length=16,window=3,width=16,heads=2,layers=1,vocab=23,prompt=4,new_tokens=3,"
        "gen_batch=1")


def test_bench_models_runs_the_rows_asked_for(capsys):
    assert cli.main(["bench", "--models", "lm,window", "--model-sizes", TINY, "--repeats", "1"]) == 0
    out, err = capsys.readouterr()
    assert err.startswith("attnkit bench --models: 2 rows x 1 rounds; about ")  # the estimate, before any row
    assert "--rows window,lm --sizes batch=2,length=12," in out  # the command reproducing the run, rows in order
    lines = [x for x in out.splitlines() if x.startswith("| ") and "training step" in x]
    assert len(lines) == 2 and "causal window 3" in lines[0] and "TransformerLM" in lines[1]
    assert "<= 0.67x" in lines[0] and "<= 1.05x" in lines[1]


@pytest.mark.parametrize("bad, message", [
    (["--models", "casual"], "unknown row 'casual'"),
    (["--models", "all", "--model-sizes", "lenght=3"], "bad size 'lenght=3'"),
])
def test_bench_models_refuses_unknown_rows_and_sizes(bad, message, capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["bench", *bad])
    assert message in capsys.readouterr().err


def test_the_estimate_of_every_row_compiled_counts_the_compilation_and_both_passes():
    from attnkit.lab.benchmarking import whole_models as wm

    eager = wm.estimate_seconds(wm.ROWS, rounds=3)
    both = wm.estimate_seconds(wm.ROWS, rounds=3, compiled=True)
    assert both == 2 * eager + len(wm.ROWS) * wm.COMPILE_SECONDS and both > 5 * 60  # minutes: said before it starts
    assert wm.estimate_seconds(("generate",), rounds=3) < wm.estimate_seconds(("window",), rounds=3)
