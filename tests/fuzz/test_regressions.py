"""Failures the differential fuzzer (tests/fuzz/test_differential.py) found, each kept as a named test."""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from tests.fuzz.cases import Case
from tests.fuzz.differential import check
from tests.fuzz.masked_softmax import attend


def test_a_key_mask_for_an_empty_batch_materialises_inside_a_combination():
    # A (0, Lk) keep mask: its size-0 batch dim was read as a broadcast dim, and indexing it failed.
    keep = masks.keys(torch.zeros(0, 129, dtype=torch.bool))
    combined = (masks.dilated(1, 4) & masks.full()) & keep
    assert combined.materialize(142, 129, batch=0, heads=6).shape == (0, 1, 142, 129)  # size 1: ignores heads
    assert keep.batch_size == 0
    q, k = torch.randn(0, 6, 142, 11), torch.randn(0, 3, 129, 11)
    assert attnkit.attention(q, k, k, mask=combined, bias=torch.randn(129)).shape == (0, 6, 142, 11)
    check(Case(rank=4, batch=0, heads=6, kv_heads=3, lq=142, lk=129, d=11, dv=11, dtype=torch.bfloat16, seed=3283,
               mask=combined, bias=("tensor", (129,), "-inf entries", False), scale=-0.7))


@pytest.mark.parametrize(("lq", "lk"), [(88, 0), (0, 0), (0, 5)])
def test_explain_with_a_bias_over_no_keys_or_no_queries(lq, lk):
    # The bias check of the bias-slabs path reduced over an empty key dim (amax has no identity).
    q, k = torch.randn(lq, 20, dtype=torch.float64), torch.randn(lk, 20, dtype=torch.float64)
    bias = torch.randn(lq, lk, dtype=torch.float64)
    assert attnkit.explain(q, k, k, bias=bias, mask=masks.causal("top_left")).path == "dense-reference"
    assert attnkit.explain(q, k, k, bias=bias, backend="chunked").path == "dense-reference"  # empty: exact path
    out = attnkit.attention(q, k, k, bias=bias, backend="chunked")
    assert out.shape == (lq, 20) and not out.any()


def test_alibi_on_the_fused_bias_path_is_exact_in_float64():
    # The path built ALiBi's term as a float32 product (slope x distance) even for float64 calls.
    case = Case(rank=4, batch=1, heads=9, kv_heads=3, lq=1, lk=5, d=1, dv=1, dtype=torch.float64, seed=0,
                bias=attnkit.bias.alibi(9))
    check(case)
    q, k, v, _ = case.tensors()
    assert attnkit.explain(q, k, v, bias=case.bias, backend="chunked").path == "bias-slabs"
    exact, _ = attend(q, k, v, bias=case.bias)
    torch.testing.assert_close(attnkit.attention(q, k, v, bias=case.bias, backend="chunked"), exact,
                               rtol=1e-13, atol=1e-13)


def test_sparsemax_over_a_finfo_min_row_in_float32():
    # The float32 plain run of the check overflowed (finfo.min + finfo.min) and its NaN error made the
    # bound NaN; the library's answer was exact. The check now ignores a plain run that is not finite.
    check(Case(rank=4, batch=1, heads=1, kv_heads=1, lq=1, lk=2, d=1, dv=1, dtype=torch.float32, seed=0,
               mask=masks.full(), bias=("tensor", (1, 1, 1, 2), "finfo.min row", False), normalize="sparsemax",
               return_weights=True))


def test_a_selected_key_past_the_keys_is_refused_and_unused_slots_with_a_bias_tensor_are_exact():
    # A selection naming a key past Lk read the bias tensor at that position (out of bounds) on the gathered
    # path; such a selection is now refused at the call (its key would be dropped), and unused slots (-1) are
    # clamped to a real position, masked out and their data zeroed.
    q = torch.randn(1, 1, 1, 1, dtype=torch.float64)
    k = torch.randn(1, 1, 3, 1, dtype=torch.float64)
    with pytest.raises(attnkit.errors.ArgumentError, match=r"indices must name a key in \[0, 3\)"):
        attnkit.attention(q, k, k, mask=masks.selected_keys(torch.tensor([[[3]]])), bias=torch.randn(3),
                          normalize="sparsemax", backend="blocksparse")
    check(Case(rank=4, batch=1, heads=1, kv_heads=1, lq=1, lk=3, d=1, dv=1, dtype=torch.float64, seed=0,
               mask=masks.selected_keys(torch.tensor([[[-1, 2, -1]]])), bias=("tensor", (3,), "-inf entries", False),
               normalize="sparsemax"))


@pytest.mark.parametrize("lk", [513, 1000])
def test_a_bfloat16_lse_with_a_relative_position_bias_over_many_keys_is_within_float32_accumulation(lk):
    # Flagged twice (5e-5 on |lse| ~ 7, 513-1000 keys, the chunked path): the lse is float32 and sums Lk terms
    # block by block; differential.lse_accumulation derives the (2 Lk + 1) u it may carry, within the contract.
    rp = attnkit.bias.RelativePositionBias(2, mode="clip", max_distance=64)
    with torch.no_grad():
        rp.table.copy_(3 * torch.randn(rp.table.shape, generator=torch.Generator().manual_seed(lk)))
    case = Case(rank=4, batch=1, heads=2, kv_heads=2, lq=24, lk=lk, d=16, dv=16, dtype=torch.bfloat16, seed=lk,
                mask=masks.causal(), bias=rp, return_lse=True)
    q, k, v, _ = case.tensors()
    assert attnkit.explain(q, k, v, mask=case.mask, bias=rp, return_lse=True, backend="chunked").path in (
        "online-softmax", "bias-slabs")
    assert {"online-softmax", "bias-slabs"} & set(check(case))  # the chunked backend's paths ran and passed
