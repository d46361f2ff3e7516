"""benchmarks/kv_policies.py: each policy at 100 % equals dense (checked), the table and the section it writes."""

from __future__ import annotations

import pytest
import torch

from attnkit.models import TransformerLM
from attnkit.nn.kv_policies import SinkWindowCache
from benchmarks import kv_policies


def _small(monkeypatch):
    monkeypatch.setattr(kv_policies, "GAP", 12)  # L = 24
    monkeypatch.setattr(kv_policies, "TEST", 6)
    torch.manual_seed(0)
    return TransformerLM(kv_policies.task().vocab_size, dim=16, num_heads=2, dropout=0.0, norm_first=True,
                         positional="rotary", max_len=None).eval()


def test_every_policy_at_the_whole_sequence_equals_dense_and_smaller_budgets_are_measured(monkeypatch):
    lm = _small(monkeypatch)
    worst, cells, dense = kv_policies.measure(lm, 2)
    assert worst < 1e-9 and len(dense) == 2
    assert set(cells) == {(p, f) for p in ("StreamingLLM", "H2O", "SnapKV", "Quest") for f in kv_policies.FRACTIONS}
    assert all(cells[p, 1.0] == dense for p in ("StreamingLLM", "H2O", "SnapKV", "Quest"))
    assert all(len(v) == 2 and all(0 <= a <= 1 for a in v) for v in cells.values())


def test_a_policy_that_is_not_dense_at_the_whole_sequence_fails_the_check(monkeypatch):
    lm = _small(monkeypatch)
    monkeypatch.setattr(kv_policies, "policies", lambda budget, length: {"StreamingLLM": SinkWindowCache(6, 2)})
    with pytest.raises(AssertionError, match="StreamingLLM"):
        kv_policies.measure(lm, 1)


def test_main_trains_once_saves_the_model_and_writes_the_section(tmp_path, monkeypatch):
    lm = _small(monkeypatch)
    calls = []
    monkeypatch.setattr(kv_policies, "train", lambda: calls.append(1) or (lm, 0.5))
    doc, saved = tmp_path / "B.md", tmp_path / "lm.pt"
    for _ in range(2):
        assert kv_policies.main(["--rounds", "1", "--model", str(saved), "--write", str(doc)]) == 0
    assert calls == [1] and saved.exists()  # the second run loaded it
    text = doc.read_text()
    assert f"## {kv_policies.TITLE}" in text and "<!-- kv-policies:start -->" in text
    assert "loaded from" in text and "| 5 % (2) | 10 % (2) | 25 % (6) | 100 % (24) |" in text
    assert text.count("| Quest |") == 1 and "| dense (no policy) |" in text
