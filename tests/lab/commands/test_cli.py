"""The attnkit command line: list, explain, bench, and its errors."""

from __future__ import annotations

import subprocess
import sys

from attnkit import registry
from attnkit.lab import cli


def test_list_shows_every_registered_mechanism_with_its_paper(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for entry in registry.entries():
        assert entry.name in out and entry.paper in out
    assert f"{len(registry.entries())} mechanisms" in out


def test_list_names_what_to_import_for_each_entry_and_it_imports(capsys):
    import importlib

    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["name", "import"]
    for entry in registry.entries():
        row = next(line.split() for line in lines if line.split()[:1] == [entry.name])
        module, _, name = row[1].rpartition(".")
        assert getattr(importlib.import_module(module), name) is entry.target, row  # the class itself, public
    assert registry.get("mamba2").import_path == "attnkit.nn.Mamba2Mixer"


def test_list_unknown_family_is_a_clear_error(capsys):
    assert cli.main(["list", "--family", "nosuch"]) == 2
    assert "no mechanism in family 'nosuch'" in capsys.readouterr().err


def test_explain_prints_the_decision(capsys):
    assert cli.main(["explain", "--q-len", "512", "--heads", "2", "--head-dim", "16",
                     "--mask", "sliding_window(16, 16)"]) == 0
    out = capsys.readouterr().out
    assert "path: band-windows (backend 'blocksparse')" in out and "block density" in out
    assert "torch-sdpa            able, not preferred: block density" in out


def test_explain_rejects_a_mask_that_is_not_a_mask_expression(capsys):
    assert cli.main(["explain", "--mask", "__import__('os')"]) == 2
    assert "cannot parse mask" in capsys.readouterr().err


def test_bench_times_every_method_and_checks_outputs(capsys):
    assert cli.main(["bench", "--q-len", "256", "--heads", "2", "--head-dim", "16", "--mask", "causal()",
                     "--repeats", "1", "--backward", "no", "--backends", "auto,chunked"]) == 0
    out = capsys.readouterr().out
    assert "torch sdpa (dense bool mask)" in out and "attnkit chunked" in out
    diffs = [float(line.rsplit("|", 2)[1]) for line in out.splitlines() if line.startswith("| attnkit")]
    assert diffs and max(diffs) < 1e-4  # every method computes the same function


def test_python_dash_m_runs():
    done = subprocess.run([sys.executable, "-m", "attnkit", "list"], capture_output=True, text=True, check=True)
    assert "mechanisms" in done.stdout
