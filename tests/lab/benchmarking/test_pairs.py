"""attnkit.lab.benchmarking.pairs: both sides checked equal first, then a ratio per interleaved round
(nothing timed)."""

from __future__ import annotations

import pytest
import torch

from attnkit.lab.benchmarking import pairs
from attnkit.lab.benchmarking.pairs import Pair, measure, table


def test_measure_checks_the_sides_agree_before_timing():
    wrong = Pair("wrong", 1.0, lambda: torch.ones(3), lambda: torch.zeros(3), "zeros")
    with pytest.raises(AssertionError):
        measure(wrong, rounds=1)


def test_the_ratio_is_taken_per_round_from_interleaved_samples(monkeypatch):
    seen = []

    def fake_rounds(fns, repeats, warmup, *, calls=1, device=None):
        seen.append((tuple(fns), repeats, calls, device))
        return {"theirs": [0.5]} if len(fns) == 1 else {"ours": [1.0, 3.0, 2.0], "theirs": [2.0, 2.0, 4.0]}
    monkeypatch.setattr(pairs, "time_rounds", fake_rounds)
    row = Pair("r", 1.1, lambda: torch.ones(2), lambda: torch.ones(2), "torch")
    result = measure(row, rounds=3, budget_s=2.0, min_calls=1, device="cpu")
    assert seen == [(("theirs",), 1, 3, "cpu"), (("ours", "theirs"), 3, 4, "cpu")]  # 4 calls fill 2 s at 0.5 s
    assert (result["ratio"], result["lo"], result["hi"]) == (0.5, 0.5, 1.5)  # medians of 0.5, 1.5, 0.5
    assert result["ours_us"] == 2e6 and result["theirs_us"] == 2e6
    lines = table([result], "ms").splitlines()
    assert lines[0].startswith("| row | against | attnkit ms | torch ms |")
    assert lines[2] == "| r | torch | 2000.0 | 2000.0 | 0.50x (0.50-1.50) | <= 1.10x | yes |"
