"""benchmarks/normalizers.py: peak memory of the normalisers over key blocks, chunked against dense."""

from __future__ import annotations

import pytest

from benchmarks import normalizers


def test_a_child_measures_one_call():
    # in a fresh process, as the benchmark runs it: in the long test process resident memory counters lag by a
    # few hundred KiB, so a call this small could read as a negative growth
    assert normalizers.peak(64, "softpick", "chunked", True, timeout=300) >= 0


def test_main_writes_the_section_from_fresh_processes(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(normalizers, "NORMALIZERS", ("stick_breaking",))
    monkeypatch.setattr(normalizers, "peak", lambda *a: seen.append(a) or (100 if a[2] == "chunked" else 10_000))
    doc = tmp_path / "B.md"
    assert normalizers.main(["--length", "64", "--write", str(doc)]) == 0
    assert sorted(seen) == [(64, "stick_breaking", "chunked", False), (64, "stick_breaking", "chunked", True),
                            (64, "stick_breaking", "reference", False)]
    text = doc.read_text()
    assert f"## {normalizers.TITLE}" in text and "| stick_breaking | 0 | 0 | 0 | 0.010 | < 0.10 | yes |" in text


def test_one_child_process_really_runs():
    assert normalizers.peak(32, "sigmoid_log_n", "chunked", False) >= 0


@pytest.mark.slow
def test_at_16384_the_chunked_path_needs_under_a_tenth_of_the_dense_paths_memory():
    for row in normalizers.rows(16384):
        assert max(row["chunked"], row["chunked_backward"]) < normalizers.TARGET * row["dense"], row
