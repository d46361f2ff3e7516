"""attnkit.lab.benchmarking.roofline: each path's fraction of the matmul ceiling, at a tiny size
(nothing here is timed)."""

from __future__ import annotations

import math

import pytest
import torch

import attnkit
from attnkit.lab.analysis.patterns import make_mask
from attnkit.lab.benchmarking import roofline

TINY = roofline.Config(lengths=(256,), heads=2, head_dim=16, window="sliding_window(8, 8)",
                       sparse="bigbird(16, 3, 1, 2)", rounds=2, budget_s=1.0, ceiling_n=128, reference_max=128)


@pytest.fixture(scope="module")
def measured():
    return roofline.run(TINY, log=lambda line: None)


def test_every_path_reports_a_fraction_of_the_ceiling(measured):
    rows, alone = measured
    assert all(rate > 0 for rate in alone.values()) and len(alone) == 3
    timed = [r for r in rows if not r.skipped]
    assert {(r.path, r.backward) for r in timed} >= {("band-windows", False), ("blocksparse-fused", True),
                                                      ("torch-sdpa", False), ("torch-sdpa", True)}
    for r in timed:
        assert len(r.fractions) == len(r.times) == len(r.ceilings) >= 2
        for t, c, f in zip(r.times, r.ceilings, r.fractions, strict=True):
            assert f == pytest.approx(r.flops / t / 1e9 / c)  # per round, against that round's ceiling
        assert all(0 < f <= 1 for f in r.fractions), (r.path, r.fractions)
        assert math.isclose(sum(r.bounds.values()), 1.0, rel_tol=1e-6)
        assert all(share >= 0 for share in r.bounds.values())
    assert sum(r.bounds.get("fused attention kernel", 0) > 0 for r in timed if r.path == "torch-sdpa") == 2


def test_reference_rows_beyond_their_limit_are_skipped_with_the_reason(measured):
    rows, _ = measured
    skipped = [r for r in rows if r.skipped]
    assert {r.path for r in skipped} == {"dense-reference"}
    assert all("GiB" in r.skipped for r in skipped)


def test_a_path_the_dispatcher_does_not_take_is_reported_not_measured():
    cfg = roofline.Config(lengths=(64,), heads=2, head_dim=8, window="sliding_window(8, 8)")
    row = roofline.Row("blocksparse-fused", "blocksparse", cfg.window, 64, False)  # a band: band-windows serves it
    products = {"mm": roofline.attention_products(8, 32)["mm 32x32x32"]}
    assert roofline.measure(row, cfg, products).skipped == "skipped: blocksparse runs band-windows here"
    assert "| skipped: blocksparse runs band-windows here |" in roofline.table([row])


def test_useful_flops_are_the_paths_own_cost():
    q = torch.randn(1, 2, 256, 16)
    decision = attnkit.explain(q, q, q, mask=make_mask(TINY.window, 256), backend="blocksparse")
    assert decision.path == "band-windows"
    _, forward, backward = decision.cost.fused
    assert roofline.useful_flops(decision, False) == forward
    assert roofline.useful_flops(decision, True) == forward + backward
    reference = attnkit.explain(q, q, q, backend="reference")
    assert roofline.useful_flops(reference, False) == reference.cost.flops == 2 * 2 * 256 * 256 * 16 * 2
    assert roofline.useful_flops(reference, True) == 3 * reference.cost.flops  # autograd: two products each


def test_the_report_names_the_command_and_the_ceiling(measured):
    rows, alone = measured
    text = roofline.report(TINY, rows, alone, "attnkit bench --roofline 256", notes="a note")
    assert text.startswith("`attnkit bench --roofline 256`, run ") and text.endswith("\n\na note")
    assert text.count("| band-windows |") == 2 and "skipped: dense scores" in text
    assert all(name in text for name in alone)
