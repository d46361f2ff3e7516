"""One row of the benchmark suite (attnkit.lab.benchmarking.rows, .methods, .check): structure, the check, verdicts.

Tiny sizes only and no timed assertion: every check is about structure or values.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from attnkit.lab.analysis.timing import Case
from attnkit.lab.benchmarking import methods as bench_methods
from attnkit.lab.benchmarking.rows import Spec, run_spec, verdict
from attnkit.lab.benchmarking.side import Method
from tests.lab.benchmarking.helpers import tiny as _tiny


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
