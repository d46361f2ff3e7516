"""``attnkit cost`` and ``attnkit scaling`` (commands/measure.py), on a parser of their own.

The scaling command's measuring is :func:`attnkit.lab.analysis.scaling.scaling` (tested in
test_scaling.py); here it is replaced by a stand-in that records its arguments, so these
tests check the command's options, output and files without starting child processes.
"""

from __future__ import annotations

import argparse
import importlib
import sys

import pytest
import torch

from attnkit.costing.analytic import cost
from attnkit.errors import ArgumentError
from attnkit.lab.analysis.scaling import ScalingRow, ScalingTable
from attnkit.lab.commands import measure

scaling_module = importlib.import_module("attnkit.lab.analysis.scaling")  # the package's `scaling` is the function


def run(argv):
    parser = argparse.ArgumentParser(prog="attnkit")
    measure.add(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture
def fake_scaling(monkeypatch):
    calls = []

    def fake(mechanisms, lengths, **kwargs):
        calls.append((mechanisms, lengths, kwargs))
        names = [m.label for m in mechanisms]
        rows = [ScalingRow(n, L, 1e-6 * L**2, 0.0, 1000 * L) for n in names for L in sorted(lengths)]
        for label in (f"{n} L={L}" for n in names for L in lengths):
            kwargs["progress"](label)
        return ScalingTable(tuple(rows), tuple(sorted(lengths)), kwargs["repeats"])
    monkeypatch.setattr(scaling_module, "scaling", fake)
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


def test_cost_prints_each_forms_flops_and_the_decoding_state_against_a_kv_cache(capsys):
    assert run(["cost", "deltanet", "--q-len", "2048", "--size", "form=recurrent"]) == 0
    out = capsys.readouterr().out
    c = cost("deltanet", q_len=2048, form="recurrent")
    assert "form=recurrent" in out and "matmul FLOPs by form (forward)" in out
    assert all(f"  {form}" in out for form in c.forms) and c.flops == c.forms["recurrent"] < c.forms["parallel"]
    assert "decoding state, one sequence at length 2048" in out and c.state_per_token == 0 < c.state_fixed
    assert run(["cost", "multi-head", "--q-len", "2048", "--heads", "4", "--head-dim", "16"]) == 0
    out = capsys.readouterr().out
    assert "growing per token (a KV cache)" in out and "by form" not in out
    assert cost("multi-head", q_len=2048, heads=4, head_dim=16).state_per_token == 2 * 64 * 4


def test_cost_errors_name_the_size():
    with pytest.raises(ArgumentError, match=r"unknown size.*windw"):
        run(["cost", "sliding-window", "--size", "windw=3"])
    with pytest.raises(SystemExit):
        run(["cost", "causal", "--size", "q_len"])  # not key=value: argparse's own error


def test_scaling_prints_writes_the_table_and_plots(fake_scaling, tmp_path, capsys):
    md, png = tmp_path / "table.md", tmp_path / "plot.png"
    assert run(["scaling", "dense", "sliding_window(8,8)", "longformer", "--lengths", "64", "128", "--repeats", "1",
                "--heads", "2", "--size", "window=3", "--markdown", str(md), "--out", str(png)]) == 0
    (mechanisms, lengths, kwargs), = fake_scaling
    assert [m.name for m in mechanisms] == ["dense", "sliding_window(8,8)", "longformer"] and lengths == [64, 128]
    assert kwargs["repeats"] == 1 and kwargs["backward"]
    dense, _, longformer = (dict(m.sizes) for m in mechanisms)
    assert dense == {"batch": 1, "heads": 2, "head_dim": 64}  # the vocabulary; the lengths are scaling's
    assert longformer == {"batch": 1, "heads": 2, "dim": 128, "window": 3}  # its width is heads x head_dim
    out = capsys.readouterr().out
    assert "| dense |" in out and f"table: {md}" in out and f"plot: {png}" in out
    assert md.read_text().startswith("| mechanism |") and png.stat().st_size > 0


def test_scaling_without_matplotlib_fails_before_measuring_and_names_the_extra(fake_scaling, tmp_path,
                                                                               monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if matplotlib were not installed
    with pytest.raises(ArgumentError, match=r'pip install "attnkit\[plot\]"'):
        run(["scaling", "dense", "--lengths", "64", "128", "--out", str(tmp_path / "p.png")])
    assert fake_scaling == [] and not (tmp_path / "p.png").exists()
    assert run(["scaling", "dense", "--lengths", "64", "--forward-only"]) == 0  # no plot asked: no matplotlib needed
    assert fake_scaling[0][2]["backward"] is False


def test_cost_defaults_are_the_realistic_sizes_of_explain_and_bench(capsys):
    assert run(["cost", "dense"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    for size in ("batch=1", "heads=8", "q_len=4096", "kv_len=4096", "head_dim=64"):
        assert size in head, head
    assert run(["cost", "longformer", "--q-len", "4096"]) == 0  # the README's example
    head = capsys.readouterr().out.splitlines()[0]
    assert "length=4096" in head and "dim=512" in head and "heads=8" in head


def test_scaling_passes_the_device_and_refuses_an_unwritable_file_before_measuring(fake_scaling, tmp_path,
                                                                                    monkeypatch):
    assert run(["scaling", "dense", "--lengths", "64"]) == 0
    assert fake_scaling[-1][2]["device"] == "cpu"
    for option in ("--markdown", "--out"):
        with pytest.raises(ArgumentError, match=rf"{option} .*no-such-folder.* does not exist"):
            run(["scaling", "dense", "--lengths", "64", option, str(tmp_path / "no-such-folder" / "f")])
    assert len(fake_scaling) == 1  # nothing measured for the refused runs
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):  # argparse's one-line error, as for every bad value
        run(["scaling", "dense", "--lengths", "64", "--device", "cuda"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert run(["scaling", "dense", "--lengths", "64", "--device", "cuda:0"]) == 0
    assert fake_scaling[-1][2]["device"] == "cuda:0"


def test_cost_kv_cache_prints_the_variants_side_by_side(capsys):
    assert run(["cost", "--kv-cache", "--heads", "16", "--head-dim", "32", "--size", "dtype=bfloat16",
                "--size", "kv_heads=2"]) == 0
    out = capsys.readouterr().out
    assert "16 heads of 32 features, bfloat16" in out and "kv_heads=2" in out and "MLA" in out
    with pytest.raises(ArgumentError, match="takes kv_heads= and dtype= here; got window"):
        run(["cost", "--kv-cache", "--size", "window=3"])
    with pytest.raises(ArgumentError, match="give a mechanism's name, or --kv-cache alone"):
        run(["cost"])
    assert run(["cost", "multi-head-latent", "--q-len", "64"]) == 0
    assert "growing per token (a KV cache)" in capsys.readouterr().out


def test_cost_kv_cache_answers_at_once_for_any_heads_and_head_dim(capsys):
    import time

    start = time.perf_counter()
    assert run(["cost", "--kv-cache", "--heads", "1000000", "--head-dim", "1000000"]) == 0
    assert time.perf_counter() - start < 5  # seconds on a busy machine; it once ran for minutes
    assert "1000000 heads of 1000000 features" in capsys.readouterr().out
