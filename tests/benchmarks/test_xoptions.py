"""benchmarks/xoptions.py: each x-transformers option of MultiHeadAttention against x-transformers' Attention."""

from __future__ import annotations

import pytest

from benchmarks import xoptions


def test_every_row_is_the_same_function_on_both_sides_and_the_section_is_written(tmp_path):
    pytest.importorskip("x_transformers.x_transformers")
    doc = tmp_path / "B.md"
    assert xoptions.main(["--length", "80", "--rounds", "1", "--write", str(doc)]) == 0  # measure() checks equality
    text = doc.read_text()
    assert f"## {xoptions.TITLE}" in text
    assert all(f"| {name}, L=80 |" in text for name in xoptions.OPTIONS)


def test_without_x_transformers_it_says_what_to_install(monkeypatch, capsys):
    import builtins
    real = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name.startswith("x_transformers"):
            raise ImportError(name)
        return real(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", refuse)
    assert xoptions.main(["--length", "24"]) == 2
    assert "pip install x-transformers" in capsys.readouterr().err
