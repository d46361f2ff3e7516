"""``attnkit cost`` and ``attnkit scaling`` (commands/measure.py), on a parser of their own.

The scaling command's measuring is :func:`attnkit.analysis.scaling.scaling` (tested in
test_scaling.py); here it is replaced by a stand-in that records its arguments, so these
tests check the command's options, output and files without starting child processes.
"""

from __future__ import annotations

import argparse
import sys

import pytest

from attnkit.analysis.cost import cost
from attnkit.analysis.scaling import ScalingRow, ScalingTable
from attnkit.commands import measure
from attnkit.errors import ArgumentError


def run(argv):
    parser = argparse.ArgumentParser(prog="attnkit")
    measure.add(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def fake_scaling(monkeypatch):
    calls = []

    def fake(names, lengths, **kwargs):
        calls.append((names, lengths, kwargs))
        rows = [ScalingRow(n, L, 1e-6 * L**2, 0.0, 1000 * L) for n in names for L in sorted(lengths)]
        for label in (f"{n} L={L}" for n in names for L in lengths):
            kwargs["progress"](label)
        return ScalingTable(tuple(rows), tuple(sorted(lengths)), kwargs["repeats"])
    monkeypatch.setattr(measure, "scaling", fake)
    return calls


def test_cost_prints_the_table_with_the_given_sizes(capsys):
    assert run(["cost", "sliding-window", "--size", "q_len=600", "--size", "window=16", "--backward"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("sliding-window: ") and "q_len=600" in out and "window=16" in out
    assert "matmul FLOPs (forward + backward)" in out and "formula:" in out
    c = cost("sliding-window", q_len=600, window=16, backward=True)
    assert all(k in out for k in c.terms)


def test_cost_parses_literal_and_word_values(capsys):
    assert run(["cost", "local", "--size", "mode=blocks", "--size", "causal=True", "--size", "length=40"]) == 0
    out = capsys.readouterr().out
    assert "mode=blocks" in out and "causal=True" in out and "length=40" in out
    assert run(["cost", "longformer", "--size", "global_tokens=(0, 3)"]) == 0
    assert "global_tokens=(0, 3)" in capsys.readouterr().out


def test_cost_errors_name_the_size():
    with pytest.raises(ArgumentError, match=r"unknown size.*windw"):
        run(["cost", "sliding-window", "--size", "windw=3"])
    with pytest.raises(SystemExit):
        run(["cost", "causal", "--size", "q_len"])  # not key=value: argparse's own error


def test_scaling_prints_writes_the_table_and_plots(fake_scaling, tmp_path, capsys):
    md, png = tmp_path / "table.md", tmp_path / "plot.png"
    assert run(["scaling", "dense", "sliding_window(8,8)", "--lengths", "64", "128", "--repeats", "1",
                "--size", "heads=2", "--markdown", str(md), "--out", str(png)]) == 0
    (names, lengths, kwargs), = fake_scaling
    assert names == ["dense", "sliding_window(8,8)"] and lengths == [64, 128]
    assert kwargs["repeats"] == 1 and kwargs["backward"] and kwargs["sizes"]["heads"] == 2
    assert kwargs["sizes"]["head_dim"] == 64  # the defaults stay for the sizes not given
    out = capsys.readouterr().out
    assert "| dense |" in out and f"table: {md}" in out and f"plot: {png}" in out
    assert md.read_text().startswith("| mechanism |") and png.stat().st_size > 0


def test_scaling_without_viz_skips_the_plot_with_a_note(fake_scaling, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "attnkit.viz", None)  # as if attnkit.viz were not there
    assert run(["scaling", "dense", "--lengths", "64", "128", "--forward-only", "--out", str(tmp_path / "p.png")]) == 0
    assert "no plot written" in capsys.readouterr().out and not (tmp_path / "p.png").exists()
    (_, _, kwargs), = fake_scaling
    assert kwargs["backward"] is False and kwargs["sizes"] is None
