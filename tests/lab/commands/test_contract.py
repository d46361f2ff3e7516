"""The command line's contract (src/attnkit/cli.py): help pages, one-line errors with exit 2, did-you-mean,
--version, and no torch import for help and version."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import attnkit
from attnkit.lab import cli

COMMANDS = ("list", "explain", "bench", "cost", "scaling", "plot-mask", "record", "tour")


def run(argv, capsys) -> tuple[int, str, str]:
    """Exit code, stdout, stderr of ``attnkit argv`` run in-process (argparse's exits included)."""
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_user_error(argv, capsys, *fragments: str) -> str:
    code, _, err = run(argv, capsys)
    assert code == 2, (argv, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnkit: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_help_has_a_description_defaults_and_an_example(command, capsys):
    code, out, _ = run([command, "--help"], capsys)
    assert code == 0
    usage, rest = out.split("\n\n", 1)
    assert usage.startswith(f"usage: attnkit {command}")
    description = rest.split("\n\n", 1)[0]
    assert len(description.split()) >= 8 and not description.startswith(("options:", "positional"))
    assert f"examples:\n  attnkit {command}" in out
    assert "``" not in out and ":func:" not in out and ":mod:" not in out  # no raw reStructuredText
    if command not in ("list", "record"):
        assert "(default: " in out


@pytest.mark.parametrize("command", ["explain", "bench", "cost"])
def test_the_size_vocabulary_and_its_defaults_are_the_same_everywhere(command, capsys):
    _, out, _ = run([command, "--help"], capsys)
    flat = " ".join(out.split())
    for option, default in (("--batch", "1"), ("--heads", "8"), ("--q-len", "4096"), ("--head-dim", "64")):
        assert f"{option} {option[2:].upper().replace('-', '_')}" in flat and f"(default: {default})" in flat
    assert "--kv-len" in flat


def test_scaling_and_plot_mask_take_the_parts_of_the_vocabulary_they_use(capsys):
    _, out, _ = run(["scaling", "--help"], capsys)
    assert all(o in out for o in ("--batch", "--heads", "--head-dim", "--lengths")) and "--q-len" not in out
    _, out, _ = run(["plot-mask", "--help"], capsys)
    assert "--q-len" in out and "--kv-len" in out and "--heads" not in out


def test_top_level_help_lists_every_command(capsys):
    code, out, _ = run(["--help"], capsys)
    assert code == 0 and all(c in out for c in COMMANDS) and "examples:" in out


def test_version(capsys):
    code, out, _ = run(["--version"], capsys)
    assert code == 0 and out.strip() == f"attnkit {attnkit.__version__}"


@pytest.mark.parametrize("argv, fragments", [
    (["explain", "--q-len", "-5"], ["explain: argument --q-len: must be an integer >= 1; got '-5'"]),
    (["explain", "--heads", "two"], ["--heads: must be an integer >= 1; got 'two'"]),
    (["explain", "--mask", "causl()"], ["unknown mask 'causl'; did you mean 'causal'?"]),
    (["explain", "--mask", "sliding_window(1, 2, 3, 4)"], ["cannot parse mask", "sliding_window()"]),
    (["explain", "--dtype", "flot32"], ["did you mean 'float32'"]),
    (["explian"], ["invalid choice 'explian'; did you mean 'explain'?"]),
    ([], ["required: COMMAND"]),
    (["list", "--family", "sparce"], ["no mechanism in family 'sparce'"]),
    (["list", "--family", "scores"], ["did you mean 'score'?"]),
    (["bench", "--bias", "alibe"], ["unknown bias 'alibe'; did you mean 'alibi'?"]),
    (["bench", "--repeats", "0"], ["--repeats: must be an integer >= 1"]),
    (["bench", "--q-len", "16", "--backends", "auto,chunkd"], ["unknown backend 'chunkd'; did you mean 'chunked'?"]),
    (["bench", "--compare", "flx"], ["unknown comparison 'flx'; did you mean 'flex'?"]),
    (["bench", "--compare", "sdpa", "--q-len", "16", "--backend", "chunkd"], ["did you mean 'chunked'?"]),
    (["cost", "longformr"], ["unknown mechanism 'longformr'; did you mean 'longformer'"]),
    (["cost", "longformer", "--kv-len", "100"], ["longformer takes one sequence length", "--q-len only"]),
    (["cost", "sliding-window", "--size", "windw=3"], ["unknown size(s) windw"]),
    (["cost", "dense", "--size", "q_len"], ["a size is key=value"]),
    (["scaling", "densee", "--lengths", "64"], ["unknown mechanism 'densee'; did you mean 'dense'?"]),
    (["scaling", "dense", "--lengths", "0"], ["--lengths: must be an integer >= 1"]),
    (["scaling", "dense", "--size", "windw=3"], ["--size windw"]),
    (["plot-mask", "causal(", "--q-len", "8"], ["cannot parse mask"]),
    (["plot-mask", "causal()", "--block-size", "0"], ["--block-size: must be an integer >= 1"]),
    (["record", "multihead"], ["did you mean 'multi-head'"]),
    (["record", "multi-head", "--format", "pdf"], ["invalid choice 'pdf'"]),
    (["tour", "--threads", "0"], ["--threads: must be an integer >= 1"]),
])
def test_a_user_error_is_one_line_with_exit_2(argv, fragments, capsys):
    line = assert_user_error(argv, capsys, *fragments)
    assert "cost:" not in line or argv[0] == "cost"  # scaling's errors are not labelled as cost's


def test_scaling_error_is_not_labelled_cost(capsys):
    line = assert_user_error(["scaling", "slidng-window", "--lengths", "64"], capsys, "did you mean 'sliding-window'")
    assert "cost" not in line


@pytest.mark.parametrize("argv", [["plot-mask", "causal()", "--q-len", "8", "--out", "m.png"],
                                  ["record", "multi-head"], ["scaling", "dense", "--lengths", "8", "--out", "s.png"]])
def test_a_missing_plot_extra_names_the_pip_command(argv, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if matplotlib were not installed
    assert_user_error(argv, capsys, 'pip install "attnkit[plot]"')
    assert not list(tmp_path.iterdir())  # nothing measured or written first


def test_html_record_needs_no_matplotlib(capsys, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = run(["record", "multi-head", "--format", "html", "--out", str(tmp_path)], capsys)
    assert code == 0, err
    assert (tmp_path / "multi-head.html").is_file() and str(tmp_path / "multi-head.html") in out


def test_explain_says_why_each_able_path_is_not_preferred(capsys):
    code, out, _ = run(["explain", "--q-len", "512", "--heads", "2", "--head-dim", "16",
                        "--mask", "sliding_window(16, 16)"], capsys)
    assert code == 0
    reasons = [line.split("able, not preferred:", 1)[1].strip() for line in out.splitlines()
               if "able, not preferred:" in line]
    assert len(reasons) >= 3 and all(len(r.split()) >= 5 for r in reasons)
    assert any("computes all Lq x Lk scores" in r for r in reasons)  # why not the chunked/reference paths


_IMPORTS = """
import json, sys
from attnkit.lab import cli
for argv in {argvs!r}:
    try:
        cli.main(argv)
    except SystemExit:
        pass
print(json.dumps(sorted(m for m in ("torch", "numpy", "matplotlib") if m in sys.modules)))
"""


def test_help_and_version_import_no_torch():
    argvs = [["--help"], ["--version"], *([c, "--help"] for c in COMMANDS)]
    done = subprocess.run([sys.executable, "-c", _IMPORTS.format(argvs=argvs)], capture_output=True, text=True,
                          check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_a_command_that_runs_does_import_torch():  # the check above can fail: it sees torch when it is there
    done = subprocess.run([sys.executable, "-c", _IMPORTS.format(argvs=[["cost", "dense", "--q-len", "8"]])],
                          capture_output=True, text=True, check=True)
    assert "torch" in json.loads(done.stdout.strip().splitlines()[-1])


def test_bench_bias_names_are_the_suites():
    from attnkit.lab.analysis.patterns import BIASES
    from attnkit.lab.commands.bench import BIAS_NAMES

    assert BIAS_NAMES == BIASES
