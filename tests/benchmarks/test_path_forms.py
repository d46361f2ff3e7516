"""benchmarks/path_forms.py: PaTH's chunk and parallel forms, time and peak memory of forward + backward."""

from __future__ import annotations

from benchmarks import path_forms


def test_a_child_measures_one_call():
    assert path_forms.child({"length": 70, "form": "chunk"}) >= 0


def test_main_writes_the_section(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(path_forms, "peak", lambda length, form: seen.append((length, form)) or 2 ** 20)
    doc = tmp_path / "B.md"
    assert path_forms.main(["--lengths", "16", "80", "--repeats", "1", "--max-gib", "1e-4", "--write", str(doc)]) == 0
    assert seen == [(16, "chunk"), (16, "parallel"), (80, "chunk")]  # 80: the parallel form's estimate is over
    text = doc.read_text()
    assert f"## {path_forms.TITLE}" in text and "| 80 |" in text and "| 1 | skipped |" in text


def test_one_child_process_really_runs():
    assert path_forms.peak(32, "parallel") >= 0
