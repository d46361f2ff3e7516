"""benchmarks/gpu: the GPU rows' definitions, one row measured on the CPU with tiny sizes (the machinery, no
time asserted), the section rendered from saved rows, and the line saying no GPU has measured them yet."""

from __future__ import annotations

import json

import torch

from benchmarks.gpu import rows as gpu_rows
from benchmarks.gpu import run


def test_the_rows_cover_sdpa_flex_the_dense_window_and_flash_attn():
    found = gpu_rows.rows()
    against = {r.against for r in found}
    assert against == {"sdpa", "sdpa-mask", "flex", "flash-attn"}
    sdpa = [r for r in found if r.against == "sdpa"]
    assert {r.length for r in sdpa} == set(gpu_rows.LENGTHS) and {r.dtype for r in sdpa} == {"bfloat16", "float16"}
    assert {r.label for r in sdpa} == {"no mask", "causal", "GQA, causal"} and all(r.goal == 1.05 for r in sdpa)
    flex = [r for r in found if r.against == "flex"]
    assert {r.label for r in flex} == set(gpu_rows.STRUCTURED) and all(r.goal == 1.10 for r in flex)
    window = found[0]
    assert (window.against, window.length, window.goal, window.backward) == ("sdpa-mask", 16384, 0.1, True)
    assert all(r.batch * r.length == gpu_rows.TOKENS or r.length > gpu_rows.TOKENS for r in found)


def test_a_row_measures_both_sides_and_checks_they_agree():
    row = next(r for r in gpu_rows.rows(quick=True) if r.label == "GQA, causal")  # the quick sizes
    torch.set_num_threads(1)
    found = gpu_rows.measure(row, device="cpu", repeats=1)
    assert found["ours"] == "attnkit -> torch-sdpa" and found["theirs"].startswith("torch sdpa")
    assert found["diff_ok"] and found["ratio"] > 0 and found["verdict"] in ("PASS", "MISS")
    assert found["ours_mib"] is None  # the CPU has no allocator peak to read
    json.dumps(found)  # plain JSON types


def test_flash_attn_rows_say_when_it_is_not_installed():
    row = next(r for r in gpu_rows.rows(quick=True) if r.against == "flash-attn")
    found = gpu_rows.measure(row, device="cpu", repeats=1)
    assert found["verdict"] == "n/a" and "flash-attn" in found["notes"]["n/a"]


def test_the_section_says_no_gpu_measured_until_one_does(tmp_path):
    doc = tmp_path / "BENCHMARKS.md"
    assert run.main(["--report", str(doc), "--results", str(tmp_path / "none.json")]) == 0
    assert "Not yet measured" in doc.read_text()
    saved = {"planned": 3, "rows": [{"label": "causal", "pass": "fwd", "sizes": "B=1", "against": "sdpa",
                                     "ours": "attnkit -> torch-sdpa", "theirs": "torch sdpa", "ours_ms": [1, 1, 1],
                                     "theirs_ms": [2, 2, 2], "ratio": 0.5, "goal": 1.05, "verdict": "PASS",
                                     "max_diff": 0.0, "device": "NVIDIA H200", "torch": "2.13.0", "notes": {}}]}
    (tmp_path / "rows.json").write_text(json.dumps(saved))
    run.main(["--report", str(doc), "--results", str(tmp_path / "rows.json")])
    text = doc.read_text()
    assert "NVIDIA H200" in text and "| causal | fwd |" in text and "Not yet measured" not in text
    assert "2 more rows were not reached" in text
