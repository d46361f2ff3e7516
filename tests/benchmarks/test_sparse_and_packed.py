"""benchmarks/sparse_and_packed.py runs every row at tiny sizes and renders its table (no measurement is kept)."""

from __future__ import annotations

import torch

from benchmarks import sparse_and_packed


def test_the_packed_and_paged_sides_compute_the_same_function():
    for sides in (sparse_and_packed.packed_sides(sparse_and_packed.SMOKE["packed"]),
                  sparse_and_packed.paged_sides(sparse_and_packed.SMOKE["paged"]),
                  sparse_and_packed.paged_sides(sparse_and_packed.SMOKE["paged"], scattered=True)):
        ours, theirs = sides
        torch.testing.assert_close(ours(), theirs(), rtol=1e-4, atol=1e-5)


def test_the_smoke_run_renders_every_row(capsys, tmp_path):
    out = tmp_path / "B.md"
    assert sparse_and_packed.main(["--smoke", "--rounds", "1", "--no-memory", "--write", str(out)]) == 0
    table = capsys.readouterr().out
    for row in ("| packed | ours", "| paged | theirs", "| paged-prefill | ours", "| sparse@96 | NSA",
                "| sparse@96 | MoBA", "| sparse@96 | DSA", "| dsa-attention@96 | ours"):
        assert row in table
    assert not out.exists()  # a smoke run writes no numbers


def test_only_runs_the_rows_it_names_and_writes_nothing(capsys, tmp_path):
    out = tmp_path / "B.md"
    assert sparse_and_packed.main(["--smoke", "--rounds", "1", "--no-memory", "--only", "paged",
                                   "--write", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| paged | ours" in table and "| paged-prefill | ours" in table and "| paged-scattered | ours" in table
    assert "| packed |" not in table and "| sparse@" not in table
    assert not out.exists()
