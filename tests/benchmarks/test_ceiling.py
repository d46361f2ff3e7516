"""benchmarks/ceiling.py: each path's fraction of the matmul ceiling, at a tiny size (nothing here is timed)."""

from __future__ import annotations

import math

import pytest
import torch
from benchmarks.harness.report import KEPT_SECTIONS, rewrite

import attnkit
from attnkit.analysis.patterns import make_mask
from benchmarks import ceiling

TINY = ceiling.Config(lengths=(256,), heads=2, head_dim=16, window="sliding_window(8, 8)",
                      sparse="bigbird(16, 3, 1, 2)", rounds=2, budget_s=1.0, ceiling_n=128, reference_max=128)


@pytest.fixture(scope="module")
def measured():
    return ceiling.run(TINY, log=lambda line: None)


def test_every_path_reports_a_fraction_of_the_ceiling_in_0_1(measured):
    rows, alone = measured
    assert all(rate > 0 for rate in alone.values()) and len(alone) == 3
    timed = [r for r in rows if not r.skipped]
    assert {(r.path, r.backward) for r in timed} >= {("band-windows", False), ("blocksparse-fused", True),
                                                      ("torch-sdpa", False), ("torch-sdpa", True)}
    for r in timed:
        assert len(r.fractions) == len(r.times) == len(r.ceilings) >= 2
        assert all(0 < f <= 1 for f in r.fractions), (r.path, r.fractions)
        assert math.isclose(sum(r.bounds.values()), 1.0, rel_tol=1e-6)
        assert all(share >= 0 for share in r.bounds.values())
    assert sum(r.bounds.get("fused attention kernel", 0) > 0 for r in timed if r.path == "torch-sdpa") == 2


def test_reference_rows_beyond_their_limit_are_skipped_with_the_reason(measured):
    rows, _ = measured
    skipped = [r for r in rows if r.skipped]
    assert {r.path for r in skipped} == {"dense-reference"}
    assert all("GiB" in r.skipped for r in skipped)


def test_useful_flops_are_the_paths_own_cost():
    q = torch.randn(1, 2, 256, 16)
    decision = attnkit.explain(q, q, q, mask=make_mask(TINY.window, 256), backend="blocksparse")
    assert decision.path == "band-windows"
    _, forward, backward = decision.cost.fused
    assert ceiling.useful_flops(decision, False) == forward
    assert ceiling.useful_flops(decision, True) == forward + backward
    reference = attnkit.explain(q, q, q, backend="reference")
    assert ceiling.useful_flops(reference, False) == reference.cost.flops == 2 * 2 * 256 * 256 * 16 * 2
    assert ceiling.useful_flops(reference, True) == 3 * reference.cost.flops  # autograd: two products each


def test_the_report_table_and_its_section(measured, tmp_path):
    rows, alone = measured
    text = ceiling.report(TINY, rows, alone, "python benchmarks/ceiling.py")
    assert text.count("| band-windows |") == 2 and "skipped: dense scores" in text
    doc = tmp_path / "B.md"
    doc.write_text("# Benchmarks\n\n<!-- suite:start -->\ns\n<!-- suite:end -->\n")
    ceiling.write(doc, text)
    ceiling.write(doc, text)  # the second write replaces the first
    assert doc.read_text().count(ceiling.START) == 1 and f"## {ceiling.TITLE}" in doc.read_text()
    assert "ceiling" in KEPT_SECTIONS and ceiling.START in rewrite(doc.read_text(), "<!-- suite:start -->\nnew")

