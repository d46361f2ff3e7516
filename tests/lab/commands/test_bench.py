"""`attnkit bench`: any row of the benchmark suite from the command line, its modes and its option errors."""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab import cli
from attnkit.lab.analysis import timing
from attnkit.lab.benchmarking import roofline, rows


def run(argv, capsys) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``attnkit bench argv`` in-process (argparse's exits included)."""
    try:
        code = cli.main(["bench", *argv])
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


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


def test_bench_roofline_runs_the_ceiling_section_with_the_given_sizes(monkeypatch, capsys):
    """``--roofline L...`` hands the lengths, --heads, --head-dim and --repeats to the roofline rows."""
    seen = []
    monkeypatch.setattr(roofline, "run", lambda cfg, log: seen.append(cfg) or ([], {"mm": 1.0}))
    assert cli.main(["bench", "--roofline", "512", "1024", "--heads", "2", "--head-dim", "16", "--repeats", "3"]) == 0
    assert seen[0].lengths == (512, 1024) and (seen[0].heads, seen[0].head_dim, seen[0].rounds) == (2, 16, 3)
    out = capsys.readouterr().out
    assert "attnkit bench --roofline 512 1024 --repeats 3" in out and "| path | mask | L |" in out
    assert cli.main(["bench", "--roofline", "--repeats", "2"]) == 0
    assert seen[1].lengths == roofline.Config.lengths


@pytest.fixture
def nothing_runs(monkeypatch):
    """Every mode's measuring replaced by a failure: an error must come before any of them."""
    def fail(*args, **kwargs):
        pytest.fail("the benchmark ran")
    for module, name in ((timing, "run_case"), (rows, "run_spec"), (roofline, "run")):
        monkeypatch.setattr(module, name, fail)


@pytest.mark.parametrize("argv, fragment", [
    (["--backend", "nope"], "unknown backend 'nope'"),
    (["--backend", "chunkd", "--compare", "sdpa"], "did you mean 'chunked'?"),
    (["--backends", "auto,"], None),  # a trailing comma is fine; the next cases are not
    (["--backends", ","], "name at least one backend"),
    (["--backend", "chunked"], "--backend does not apply to the default table (it applies to --compare)"),
    (["--backends", "sdpa", "--compare", "sdpa"], "--backends does not apply to --compare"),
    (["--procs", "3"], "--procs does not apply to the default table (it applies to --distributed)"),
    (["--compare", "sdpa", "--models", "all"], "--compare and --models are separate modes"),
    (["--roofline", "--distributed"], "--roofline and --distributed are separate modes"),
    (["--roofline", "64", "--q-len", "8"], "--q-len does not apply to --roofline"),
    (["--roofline", "64", "--threads", "2"], "--threads does not apply to --roofline"),
    (["--models", "lm", "--mask", "causal()"], "--mask does not apply to --models"),
    (["--model-sizes", "length=4"], "--model-sizes does not apply to the default table (it applies to --models)"),
    (["--compiled"], "--compiled does not apply to the default table"),
    (["--goal", "2"], "--goal does not apply to the default table"),
    (["--compare", "additive", "--mask", "causal()"], "--mask does not apply to --compare additive"),
    (["--mask", "causl()"], "unknown mask 'causl'"),
    (["--compare", "sdpa", "--mask", "bigbird(64)"], "cannot build mask 'bigbird(64)'"),
    (["--distributed", "--mask", "documents(2)"], "unknown mask 'documents'"),
    (["--device", "gpu"], "--device: must be cpu, cuda or cuda:N; got 'gpu'"),
    (["--repeats", "0"], "--repeats: must be an integer >= 1"),
])
def test_a_bad_value_is_one_line_and_exit_2_before_anything_runs(argv, fragment, nothing_runs, capsys):
    if fragment is None:
        assert cli.build_parser().parse_args(["bench", *argv]).backends == ("auto",)
        return
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnkit: error: ") and fragment in lines[0], err


def test_an_unavailable_device_is_refused_and_a_cpu_only_mode_names_the_option(nothing_runs, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = run(["--device", "cuda"], capsys)
    assert code == 2 and "'cuda' is not available: torch" in err and "sees no CUDA device" in err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a machine with two GPUs
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    code, _, err = run(["--device", "cuda:2"], capsys)
    assert code == 2 and "torch sees 2 CUDA device(s), cuda:0 to cuda:1" in err
    for mode in (["--roofline"], ["--distributed"]):
        code, _, err = run([*mode, "--device", "cuda:1"], capsys)
        assert code == 2 and f"--device does not apply to {mode[0]}" in err, err


def test_an_error_while_measuring_is_not_printed_on_the_progress_bar_line(monkeypatch, capsys):
    """The bar is closed (its line cleared) before the error is printed; tqdm writes to stderr."""
    def fails(case, *, repeats, backends, progress, refused=None):
        progress("timing 2 methods")
        raise ArgumentError("a method refused the case")
    monkeypatch.setattr(timing, "run_case", fails)
    code, _, err = run(["--q-len", "16", "--heads", "2", "--head-dim", "8", "--backward", "no"], capsys)
    assert code == 2
    before, _, after = err.rpartition("attnkit: error: ")
    assert after == "a method refused the case\n"
    line = before.rsplit("\n", 1)[-1].split("\r")  # what the terminal shows on the error's line
    assert line[-1] == "" and all(not piece.strip() for piece in line[-2:]), repr(before)


def test_a_backend_asked_for_that_cannot_run_is_refused_with_its_reason_never_dropped(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # flex runs on CUDA only
    small = ["--q-len", "16", "--heads", "2", "--head-dim", "8", "--repeats", "1", "--backward", "no"]
    code, out, err = run([*small, "--backends", "flex"], capsys)
    assert code == 2 and "| method |" not in out
    assert "no backend asked for can run this case: flex: backend='flex' cannot honour this call" in err, err
    code, out, err = run([*small, "--backends", "flex,chunked"], capsys)
    assert code == 0 and "| attnkit chunked |" in out and "attnkit flex" not in out
    warning = [line for line in err.splitlines() if "warning" in line]
    assert warning == ["attnkit: warning: backend 'flex' is not in the table: backend='flex' cannot honour this "
                       "call: CUDA only"], err
