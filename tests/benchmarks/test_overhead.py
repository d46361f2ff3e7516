"""benchmarks/overhead.py: the breakdown times the fast lane's own parts, and the lane trusts only good answers."""

import math

import torch

from attnkit.kernels import lane, rules
from benchmarks import overhead


def test_the_breakdown_names_the_lanes_parts():
    table = overhead.breakdown(lk=16, calls=2)
    names = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert names == ["torch SDPA (F.scaled_dot_product_attention)", "attnkit.attention(q, k, v, mask=causal())",
                     "the lane's attribute checks (lane.route)", "the fused kernel, called directly (with its lse)",
                     "the output check (lane.trusted: the lse read as floats, one sum, one sync)"]


def test_the_check_it_times_refuses_non_finite_outputs_and_zeroed_rows():
    q = k = v = torch.randn(1, 2, 3, 8)
    out, lse = rules.FLASH(q, k, v, 0.0, False, attn_mask=None, scale=8 ** -0.5)
    assert lane.trusted(out, lse)
    for bad_out, bad_lse in ((out.clone().fill_(math.nan), lse), (out, lse.clone().fill_(0.0)),
                             (out, lse.clone().fill_(math.inf))):
        assert not lane.trusted(bad_out, bad_lse)


def test_the_module_rows_call_both_modules_alike_and_agree():
    rows = overhead.module_rows()
    assert [row.name.split(", ")[-1] for row in rows] == ["need_weights=False", "need_weights=True (torch's default)"]
    for row in rows:
        torch.testing.assert_close(row.ours(), row.theirs(), rtol=1e-4, atol=1e-5)  # what measure() checks first
    _, weights = rows[1].ours()
    assert weights.shape == (4, 128, 128)  # head-averaged weights, as torch's default returns
