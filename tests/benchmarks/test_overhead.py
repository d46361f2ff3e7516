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
