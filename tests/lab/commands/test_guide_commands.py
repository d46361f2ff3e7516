"""Every ``attnkit ...`` line of the command-line guide (docs/guide/cli.md) runs as written, at small sizes.

The lines are read from the guide itself, so an example that stops working fails here.
Sizes are made small (``--q-len``, ``--kv-len``, ``--lengths``, ``q_len=``) and nothing
else is changed. The quick ones run in-process in the default suite; the ones that
start child processes or compile (bench, scaling, a transformers model) are ``slow``.
``attnkit tour`` lines (minutes of training) are parsed and listed, not run.
"""

from __future__ import annotations

import re
import shlex

import pytest

from attnkit.lab import cli
from tests.user_docs import guide

SMALL_LEN = "128"
SLOW = ("bench", "scaling", "record hf:")  # child processes, compiles or a pretrained model


def readme_commands() -> list[str]:
    """The command lines of the guide's first ``bash`` block (comments after ``#`` dropped)."""
    block = guide("cli").split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [shlex.split(line, comments=True) for line in block.splitlines() if line.startswith("attnkit ")]
    return [shlex.join(argv) for argv in lines]


def small(argv: list[str]) -> list[str]:
    """``argv`` with its sequence lengths made small; every other word as written."""
    out, in_lengths = [], False
    for word in argv:
        if in_lengths and word.isdigit():
            continue  # replaced below
        in_lengths = word == "--lengths"
        if out and out[-1] in ("--q-len", "--kv-len"):
            word = SMALL_LEN
        out.append(re.sub(r"^(q_len|kv_len)=\d+$", rf"\1={SMALL_LEN}", word))
        if in_lengths:
            out += [str(int(SMALL_LEN) // 2), SMALL_LEN]
    return out


COMMANDS = readme_commands()
QUICK = [c for c in COMMANDS if not c.removeprefix("attnkit ").startswith(SLOW) and " tour" not in c]


def test_the_section_has_the_commands_it_should():
    assert len(COMMANDS) >= 9
    for name in ("list", "explain", "bench", "record", "plot-mask", "cost", "scaling", "tour"):
        assert any(c.startswith(f"attnkit {name} ") or c == f"attnkit {name}" for c in COMMANDS), name
    assert "attnkit cost longformer --q-len 4096" in COMMANDS


def test_small_changes_only_the_lengths():
    assert small(shlex.split("attnkit scaling dense --lengths 1024 2048 4096 --out s.png")) == \
        ["attnkit", "scaling", "dense", "--lengths", "64", "128", "--out", "s.png"]
    assert small(["attnkit", "cost", "x", "--size", "q_len=4096", "--q-len", "9"]) == \
        ["attnkit", "cost", "x", "--size", "q_len=128", "--q-len", "128"]


@pytest.mark.parametrize("line", COMMANDS)
def test_every_command_parses(line):
    args = cli.build_parser().parse_args(small(shlex.split(line))[1:])
    assert callable(args.func)


def _run(line: str, tmp_path, monkeypatch, capsys) -> str:
    monkeypatch.chdir(tmp_path)  # the commands that write files write them here
    code = cli.main(small(shlex.split(line))[1:])
    captured = capsys.readouterr()
    assert code == 0, f"{line}: exit {code}: {captured.err}"
    assert "Traceback" not in captured.err
    return captured.out


@pytest.mark.parametrize("line", QUICK)
def test_quick_commands_run_as_written(line, tmp_path, monkeypatch, capsys):
    out = _run(line, tmp_path, monkeypatch, capsys)
    assert out.strip()
    for word in shlex.split(line):
        if word.endswith((".png", ".svg")):
            assert (tmp_path / word).stat().st_size > 0  # the picture it names was written


@pytest.mark.parametrize("line", [c for c in COMMANDS if c.startswith("attnkit tour")])
def test_tour_is_listed_not_run(line, tmp_path, monkeypatch, capsys):
    out = _run(line + " --list", tmp_path, monkeypatch, capsys)
    assert ("runs x seeds" if "--suite long" in line else "experiments") in out


@pytest.mark.slow
@pytest.mark.parametrize("line", [c for c in COMMANDS if c not in QUICK and " tour" not in c])
def test_slow_commands_run_as_written(line, tmp_path, monkeypatch, capsys):
    assert _run(line, tmp_path, monkeypatch, capsys).strip()
