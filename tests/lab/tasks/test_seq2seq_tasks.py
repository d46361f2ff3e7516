"""Dates and reversal: round trips through datetime, and the BOS/EOS/PAD/-100 layout."""

import datetime
import re

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab import tasks
from attnkit.lab.tasks import IGNORE_INDEX
from attnkit.lab.tasks.seq2seq import BOS, EOS, PAD

# written independently of the generator's format list (C-locale English names)
STRPTIME = ["%d %B %Y", "%B %d, %Y", "%m/%d/%Y", "%Y.%m.%d", "%a %d %b %y", "%d-%b-%Y", "%A, %B %d, %Y", "%Y%m%d"]


def _parse(text, lo, hi):
    for fmt in STRPTIME:
        try:
            day = datetime.datetime.strptime(text, fmt).date()
        except ValueError:
            continue
        if "%y" in fmt:  # two-digit year: the one year of the range with these last digits
            day = day.replace(year=next(y for y in range(lo, hi + 1) if y % 100 == day.year % 100))
            assert text.split()[0] == day.strftime("%a")  # the weekday matches the date
        return day
    raise AssertionError(f"no format parses {text!r}")


def test_dates_round_trip_through_datetime():
    task = tasks.get("dates", min_year=1990, max_year=2030)
    batch = task.sample(400, generator=torch.Generator().manual_seed(0))
    seen = set()
    for src, tgt in zip(batch["inputs"], batch["targets"], strict=True):
        source, iso = task.decode(src), task.decode(tgt)
        day = datetime.datetime.strptime(iso, "%Y-%m-%d").date()
        assert iso == day.isoformat() and 1990 <= day.year <= 2030
        assert _parse(source, 1990, 2030) == day
        seen.add(sum(c.isalpha() for c in source) > 0)
    assert seen == {True, False}  # both numeric and named formats occur


def test_dates_cover_every_format_and_leap_days_are_valid():
    task = tasks.get("dates", min_year=2000, max_year=2000)
    batch = task.sample(3000, generator=torch.Generator().manual_seed(1))
    targets = {task.decode(t) for t in batch["targets"]}
    assert "2000-02-29" in targets and all(t.startswith("2000-") for t in targets)
    sources = [task.decode(s) for s in batch["inputs"][:300]]
    signatures = {re.sub(r"\d+", "9", re.sub(r"[A-Za-z]+", "A", s)) for s in sources}
    assert signatures == {"9 A 9", "A 9, 9", "9/9/9", "9.9.9", "A 9 A 9", "9-A-9", "A, A 9, 9", "9"}


def _check_layout(task, batch):
    src, dec, y = batch["inputs"], batch["decoder_inputs"], batch["targets"]
    assert src.shape[1] == task.source_len and dec.shape == y.shape == (src.shape[0], task.target_len)
    for s, d, t, ls, lt in zip(src.tolist(), dec.tolist(), y.tolist(), batch["source_lengths"].tolist(),
                               batch["target_lengths"].tolist(), strict=True):
        assert s[ls - 1] == EOS and all(c > EOS for c in s[:ls - 1]) and all(c == PAD for c in s[ls:])
        assert d[0] == BOS and d[lt] == EOS and all(c > EOS for c in d[1:lt]) and all(c == PAD for c in d[lt + 1:])
        assert t[:lt] == d[1:lt + 1] and all(c == IGNORE_INDEX for c in t[lt:])


@pytest.mark.parametrize("name", ["dates", "reversal"])
def test_seq2seq_layout(name):
    task = tasks.get(name)
    _check_layout(task, task.sample(50, generator=torch.Generator().manual_seed(0)))


def test_reversal_targets_reverse_the_source():
    task = tasks.get("reversal", min_len=2, max_len=6, num_letters=5)
    batch = task.sample(200, generator=torch.Generator().manual_seed(0))
    lengths = set()
    for src, tgt in zip(batch["inputs"], batch["targets"], strict=True):
        s, t = task.decode(src), task.decode(tgt)
        assert t == s[::-1] and set(s) <= set("abcde")
        lengths.add(len(s))
    assert lengths == {2, 3, 4, 5, 6}


def test_encode_decode():
    task = tasks.get("reversal")
    ids = task.encode("hello")
    assert task.decode([BOS, *ids, EOS, 7, 8]) == "hello"
    assert task.decode(torch.tensor([*ids, IGNORE_INDEX, PAD])) == "hello"
    with pytest.raises(ArgumentError, match="text"):
        task.encode("Hello!")


def test_exact_match_scores_whole_sequences():
    task = tasks.get("reversal")
    batch = task.sample(4, generator=torch.Generator().manual_seed(0))
    pred = batch["targets"].clone()
    pred[0, 0] = (pred[0, 0] + 1) % task.vocab_size
    pred[0, 1] = (pred[0, 1] + 1) % task.vocab_size  # two errors in one sequence still cost one sequence
    assert task.accuracy(pred, batch) == 0.75
