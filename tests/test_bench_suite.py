"""The issue-7 benchmark suite: row structure, the correctness check, BENCHMARKS.md rewriting, `attnkit bench`.

Tiny sizes only and no timed assertion: every check is about structure or values.
"""

from __future__ import annotations

import functools
import importlib
import json
import shlex
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnkit import cli
from attnkit.analysis import bench_methods
from attnkit.analysis.bench import Case
from attnkit.analysis.bench_methods import Method
from attnkit.analysis.bench_patterns import active_pairs, dense_bias, make_mask
from attnkit.analysis.bench_report import SCALING_END, SCALING_START, render, rewrite
from attnkit.analysis.bench_rows import Row, Spec, run_spec, verdict

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


def _tiny(mask="sliding_window(3, 2)", backward=False, **kw):
    return Case(batch=2, heads=3, q_len=40, head_dim=8, mask=mask, backward=backward, **kw)


def _suite_module(name):
    sys.path.insert(0, str(BENCH_DIR))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH_DIR))


# ----------------------------------------------------------------- rows


@pytest.mark.parametrize("backward", [False, True])
def test_rows_of_a_spec_are_consistent(backward):
    spec = Spec(2, "window", _tiny(backward=backward), ("sdpa-mask", "sdpa"), (0.5,), repeats=3)
    rows = run_spec(spec, ceiling={"float32": 10.0})
    assert [r.theirs for r in rows] == ["torch sdpa (dense bool mask)", "sdpa"]
    dense, missing = rows
    assert dense.runs == 3 and dense.pass_ == ("fwd+bwd" if backward else "fwd")
    assert dense.ours_s[1] <= dense.ours_s[0] <= dense.ours_s[2]
    assert dense.theirs_s[1] <= dense.theirs_s[0] <= dense.theirs_s[2]
    assert dense.ratio == pytest.approx(dense.ours_s[0] / dense.theirs_s[0])
    assert dense.diff_ok is True and dense.max_diff < 1e-5
    assert dense.verdict in ("PASS", "MISS") and dense.goal == 0.5
    assert dense.ceiling_frac == pytest.approx(dense.gflops / 10.0)
    # the useful work: 2 (D + Dv) flops per allowed pair, x3 with the backward
    pairs = sum(1 for i in range(40) for j in range(40) if -3 <= j - i <= 2) * 2 * 3
    assert dense.gflops * dense.ours_s[0] * 1e9 == pytest.approx(2 * 16 * pairs * (3 if backward else 1))
    assert missing.verdict == "n/a" and missing.ratio is None and "dense mask" in missing.notes["n/a"]
    assert dense.sizes == "B=2 H=3 L=40 D=8 float32" and dense.length == 40
    assert json.loads(json.dumps(dense.__dict__)) == dense.__dict__  # plain JSON: cacheable


def test_the_check_catches_a_wrong_forward(monkeypatch):
    def wrong(case, q, k, v, mask, modifier):  # scores scaled twice as much: another function
        dense = mask.materialize(q.shape[2], k.shape[2])[0, 0]
        return Method("wrong", lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense, scale=0.7), (q, k, v))
    monkeypatch.setattr(bench_methods, "_sdpa_mask", wrong)
    row = run_spec(Spec(3, "w", _tiny(), ("sdpa-mask",), (100.0,), repeats=1))[0]
    assert row.diff_ok is False and row.verdict == "WRONG" and row.max_diff > 1e-2


class _HalfGradient(torch.autograd.Function):
    """Identity forward, half the gradient backward: right outputs, wrong gradients."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * 0.5


def test_the_check_catches_a_wrong_gradient(monkeypatch):
    def wrong_grad(case, q, k, v, mask, modifier):
        dense = mask.materialize(q.shape[2], k.shape[2])[0, 0]
        run = lambda: F.scaled_dot_product_attention(_HalfGradient.apply(q), k, v, attn_mask=dense)
        return Method("wrong gradient", run, (q, k, v))
    monkeypatch.setattr(bench_methods, "_sdpa_mask", wrong_grad)
    fwd = run_spec(Spec(3, "w", _tiny(), ("sdpa-mask",), repeats=1))[0]
    both = run_spec(Spec(3, "w", _tiny(backward=True), ("sdpa-mask",), repeats=1))[0]
    assert fwd.diff_ok is True and both.diff_ok is False and both.verdict == "WRONG"


def test_bias_rows_check_the_dense_bias_and_not_the_throughput_reference():
    case = Case(batch=1, heads=3, q_len=24, head_dim=8, bias="alibi")
    unbiased, dense = run_spec(Spec(4, "alibi", case, ("sdpa", "sdpa-bias"), (1 / 0.6, 1.0), repeats=1))
    assert unbiased.max_diff is None and "throughput" in unbiased.notes["check"]
    assert dense.diff_ok is True and dense.max_diff < 1e-5


def test_bf16_rows_compare_with_attnkits_own_float32():
    case = _tiny(dtype="bfloat16", backward=True)
    sdpa, fp32 = run_spec(Spec(5, "bf16", case, ("sdpa-mask", "fp32"), (1.0, 1.0), repeats=1))
    assert fp32.theirs.endswith("(float32)") and fp32.diff_ok is True and fp32.max_diff > 1e-4
    assert sdpa.diff_ok is True


def test_additive_rows_share_parameters_and_agree():
    case = Case(batch=2, heads=1, q_len=5, kv_len=7, head_dim=11, backward=True)
    row = run_spec(Spec(6, "additive", case, ("additive",), (1.0,), repeats=1, mem_goal=0.25))[0]
    assert row.diff_ok is True and row.max_diff < 1e-5
    assert row.verdict == "MISS"  # a memory goal without a memory measurement never passes
    assert row.sizes == "B=2 Lq=5 Lk=7 hidden=11 float32"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch's own, raised while importing its compiler
def test_flex_without_cpu_backward_is_reported_not_raised():
    row = run_spec(Spec(2, "w", _tiny(backward=True), ("flex",), (1.0,), repeats=1))[0]
    assert row.verdict == "n/a" and row.notes["n/a"]


def test_verdicts():
    assert verdict(0.9, 1.0, True) == "PASS"
    assert verdict(1.1, 1.0, True) == "MISS"
    assert verdict(0.9, 1.0, False) == "WRONG"
    assert verdict(0.9, None, True) == "—"
    assert verdict(None, 1.0, None) == "n/a"
    assert verdict(0.9, 1.0, True, mem_ratio=0.3, mem_goal=0.25) == "MISS"
    assert verdict(0.9, 1.0, True, mem_ratio=0.2, mem_goal=0.25) == "PASS"


# ------------------------------------------------------------- patterns


def test_active_pairs_counts_allowed_entries():
    for text in ("sliding_window(3, 2)", "documents(3)", "causal() & strided(4)"):
        dense = make_mask(text, 23).materialize(23, 23)
        assert active_pairs(make_mask(text, 23), 2, 3, 23, 23) == int(dense.sum()) * 6
    assert active_pairs(None, 2, 3, 5, 7) == 210


def test_extra_patterns():
    docs = make_mask("documents(3)", 9).materialize(9, 9)[0, 0]
    assert docs.equal(torch.block_diag(*[torch.ones(3, 3, dtype=torch.bool)] * 3))
    big = make_mask("bigbird(4, 3, 1, 0)", 16).materialize(16, 16)[0, 0]
    assert big[:4].all() and big[:, :4].all()  # one global block row and column
    assert big[8:12, 4:16].equal(torch.ones(4, 12, dtype=torch.bool))  # band of 3 blocks around block 2
    assert not big[12:, 4:8].any()
    lf = make_mask("longformer(1, 2)", 6).materialize(6, 6)[0, 0]
    assert lf[:, :2].all() and lf[:2].all() and lf[3, 4] and not lf[5, 2]


def test_dense_alibi_bias_is_minus_slope_times_distance():
    bias = dense_bias("alibi", 2, 3, 4)
    slopes = [2 ** -4, 2 ** -8]  # 2^(-8/H * (h+1)) for H = 2
    for h in range(2):
        for i in range(3):
            for j in range(4):
                assert bias[0, h, i, j].item() == pytest.approx(-slopes[h] * abs(i + 1 - j))  # bottom-right
    assert dense_bias("softcap", 2, 3, 4) is None


# -------------------------------------------------------------- report


def _fake_rows():
    ok = Row(1, "no mask", "B=1 H=8 L=128 D=64 float32", "fwd", "attnkit auto -> sdpa", "torch sdpa (no mask)", 8,
             [1e-3, 9e-4, 2e-3], [1e-3, 9e-4, 1.1e-3], 1.0, 1.3, "PASS", 0.0, True, 12.0, 0.1)
    miss = Row(2, "window ±128", "B=1 H=8 L=4096 D=64 float32", "fwd+bwd", "attnkit auto -> blocksparse",
               "torch sdpa (dense bool mask)", 5, [0.5, 0.4, 0.6], [1.0, 0.9, 1.2], 0.5, 0.2, "MISS", 1e-7, True,
               20.0, 0.2, 2**27, 2**28, density=0.08, profile=["aten::bmm: 1.0 ms (50%, 8 calls)"])
    return [ok, miss]


def _render(rows):
    info = {"date": "2026-01-01 00:00 UTC", "cpu": "cpu", "cores": 2, "flags": ["avx2"],
            "torch_cpu_capability": "AVX2", "torch": "2.x", "threads": 2, "python": "3.11"}
    ceil = {"float32": {"1": 100.0, "all": 190.0, "n": 2048}}
    return render(title="Suite", intro=["intro"], info=info, ceiling=ceil, command="python benchmarks/run.py",
                  rows=rows, targets={1: "dense", 2: "window", 3: "patterns"}, plots=[("window", "plots/w.png")],
                  extras={2: ["a note"]})


def test_rewrite_keeps_the_scaling_section_and_is_idempotent():
    scaling = f"{SCALING_START}\n## Scaling\n\n| a | b |\n|---|---|\n| 1 | 2 |\n{SCALING_END}"
    old = f"# Benchmarks\n\n<!-- core:start -->\nold core numbers\n<!-- core:end -->\n\n{scaling}\n\ntrailing\n"
    suite = _render(_fake_rows())
    once = rewrite(old, suite)
    assert scaling in once and "old core numbers" not in once and "trailing" not in once
    assert rewrite(once, suite) == once
    assert once.index("<!-- suite:end -->") < once.index(SCALING_START)
    assert rewrite("", suite) == "# Benchmarks\n\n" + suite


def test_render_shows_each_target_its_misses_and_profiles():
    text = _render(_fake_rows())
    assert "### 1. dense" in text and "### 2. window" in text
    assert "### 3. patterns\n\nNot measured in this run." in text
    assert "| **MISS** |" in text and "| PASS |" in text and "a note" in text
    assert "- target 2, window ±128" in text and "aten::bmm" in text
    assert "![window](plots/w.png)" in text
    assert "| 128 | 256 | 0.50 |" in text  # memory: attnkit MiB, theirs MiB, ratio
    assert "1000 (900-1200)" in text  # theirs ms, median (min-max)
    assert "- none" in _render(_fake_rows()[:1])


# --------------------------------------------------------------- suite


def test_suite_covers_every_target_with_unique_reproducible_specs():
    suite = _suite_module("suite")
    parser = cli.build_parser()
    for quick in (True, False):
        specs = suite.specs(quick)
        assert {s.target for s in specs} == {1, 2, 3, 4, 5, 6}
        assert len({s.key for s in specs}) == len(specs)
        for spec in specs:
            assert Spec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
            args = parser.parse_args(shlex.split(suite.bench_command(spec))[1:])
            assert args.compare == spec.compare and args.q_len == spec.case.q_len
            assert args.mask == spec.case.mask and args.bias == spec.case.bias and args.dtype == spec.case.dtype
    huge = [s for s in suite.specs(False) if s.case.q_len == 16384]
    assert huge and all(s.repeats <= 2 for s in huge)  # the dense-mask baseline costs tens of seconds there


def test_suite_caches_each_spec_and_resumes(tmp_path, monkeypatch):
    run = _suite_module("run")
    calls = []

    def fake_run_spec(spec, **kw):
        calls.append(spec.key)
        return [Row(spec.target, spec.label, "s", "fwd", "a", "b", 1, [1.0, 1.0, 1.0], gflops=2.0)]
    monkeypatch.setattr(run, "run_spec", fake_run_spec)
    specs = [Spec(1, "x", _tiny(), ("sdpa-mask",)), Spec(2, "y", _tiny(backward=True), ("sdpa-mask",))]
    measure = functools.partial(run.measure, isolated=False)  # the fake run_spec lives in this process
    first = measure(specs, tmp_path, fresh=False, only=None, ceil={"float32": 4.0})
    assert len(calls) == 2 and sorted(p.stem for p in tmp_path.glob("*.json")) == sorted(s.key for s in specs)
    again = measure(specs, tmp_path, fresh=False, only=None, ceil={"float32": 4.0})
    assert len(calls) == 2 and [r.__dict__ for r in again] == [r.__dict__ for r in first]
    assert again[0].ceiling_frac == 0.5
    measure(specs, tmp_path, fresh=True, only={2}, ceil={})
    assert calls[2:] == [specs[1].key]
    monkeypatch.setattr(run, "code_version", lambda: "another commit")
    measure(specs, tmp_path, fresh=False, only=None, ceil={})
    assert len(calls) == 5  # rows measured with other code are stale


# ---------------------------------------------------------- attnkit bench


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


def test_goal_ratio_of_five_times_faster_is_shown_as_such():
    from attnkit.analysis.bench_report import goal_text
    assert goal_text(0.2) == "≥ 5x faster" and goal_text(1.05) == "≤ 1.05x"
    assert goal_text(None, 0.25) == "memory ≤ 0.25x" and goal_text(None) == "—"


def test_a_failing_row_is_reported_and_not_cached(tmp_path, monkeypatch):
    run = _suite_module("run")

    def broken(spec, **kw):
        raise TypeError("a kernel broke")
    monkeypatch.setattr(run, "run_spec", broken)
    spec = Spec(4, "softcap", _tiny(bias="softcap", mask=None), ("eager",))
    (row,) = run.measure([spec], tmp_path, fresh=False, only=None, ceil={}, isolated=False)
    assert row.verdict == "ERROR" and "TypeError: a kernel broke" in row.notes["error"]
    assert not list(tmp_path.glob("*.json"))
    assert "failed: TypeError: a kernel broke" in _render([row])


def test_isolated_rows_come_from_a_child_process(tmp_path, monkeypatch):
    """A spec measured in a fresh child: the same rows as in process; a child's failure is an ERROR row."""
    run = _suite_module("run")
    spec = Spec(1, "tiny", _tiny(), ("sdpa-mask",), repeats=1)
    monkeypatch.setattr(run, "run_spec", lambda *a, **kw: pytest.fail("measured in the parent process"))
    (row,) = run.measure([spec], tmp_path, fresh=True, only=None, ceil={"float32": 4.0})
    assert (row.target, row.label, row.theirs) == (1, "tiny", "torch sdpa (dense bool mask)")
    assert row.verdict != "ERROR" and row.max_diff is not None and row.max_diff < 1e-5 and row.ours_s
    bad = Spec(1, "bad", _tiny(mask="no_such_mask(3)"), ("sdpa-mask",), repeats=1)
    (err,) = run.measure([bad], tmp_path, fresh=True, only=None, ceil={})
    assert err.verdict == "ERROR" and "child measuring 'bad' failed" in err.notes["error"]
