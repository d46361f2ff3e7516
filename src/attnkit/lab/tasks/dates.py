"""Date normalisation: human-written dates to ISO 8601, character level."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import ClassVar

from ...errors import ArgumentError, check_int
from .base import python_rng, register
from .seq2seq import CharSeq2Seq

__all__ = ["Dates", "FORMATS"]

_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _month(d: datetime.date) -> str:
    return _MONTHS[d.month - 1]


def _weekday(d: datetime.date) -> str:
    return _DAYS[d.weekday()]


FORMATS = (
    lambda d: f"{d.day} {_month(d)} {d.year}",                                   # 3 March 2021
    lambda d: f"{_month(d)} {d.day}, {d.year}",                                  # March 3, 2021
    lambda d: f"{d.month:02d}/{d.day:02d}/{d.year}",                             # 03/03/2021 (month first)
    lambda d: f"{d.year}.{d.month:02d}.{d.day:02d}",                             # 2021.03.03
    lambda d: f"{_weekday(d)[:3]} {d.day} {_month(d)[:3]} {d.year % 100:02d}",   # Wed 3 Mar 21
    lambda d: f"{d.day:02d}-{_month(d)[:3]}-{d.year}",                           # 03-Mar-2021
    lambda d: f"{_weekday(d)}, {_month(d)} {d.day}, {d.year}",                   # Wednesday, March 3, 2021
    lambda d: f"{d.year}{d.month:02d}{d.day:02d}",                               # 20210303
)
"""The source formats, each ``date -> str`` (English names, independent of the locale)."""

_CHARS = "".join(sorted(set("0123456789 ,./-" + "".join(_MONTHS) + "".join(_DAYS))))
# the longest rendering: four-digit years, so a fortnight covers every weekday with two-digit days
_LONGEST = max(len(f(datetime.date(2000, 9, 16 + i))) for f in FORMATS for i in range(14))


@register
@dataclass(frozen=True)
class Dates(CharSeq2Seq):
    """Date normalisation: ``"Wed 3 Mar 21"`` -> ``"2021-03-03"``, character by character.

    A classic attention demonstration for neural machine translation: the "date format
    translation" exercise of Andrew Ng's Sequence Models course and of Chollet's / Luong-style
    tutorials, after Bahdanau, Cho & Bengio 2015, "Neural Machine Translation by Jointly
    Learning to Align and Translate", ICLR, arXiv:1409.0473 (the task itself is generated,
    not from a paper). Dates are uniform over ``min_year-01-01 .. max_year-12-31`` (valid
    calendar dates only, via ``datetime``); the source uses one of ``FORMATS`` at random::

        3 March 2021 | March 3, 2021 | 03/03/2021 (month first) | 2021.03.03 | Wed 3 Mar 21
        03-Mar-2021 | Wednesday, March 3, 2021 | 20210303                      -> 2021-03-03

    Two-digit years are unambiguous because the year range spans at most 100 years (``yy``
    means the one year of the range ending in ``yy``). Source and target share one vocabulary
    (see :class:`~attnkit.lab.tasks.seq2seq.CharSeq2Seq` for the batch layout).

    Differences from the paper: not a paper's data set; a generated stand-in.

    Shapes:
        ``inputs (n, source_len)``, ``decoder_inputs (n, 12)``, ``targets (n, 12)`` long.

    Complexity: ``O(n)`` Python string formatting per batch.

    Args:
        min_year, max_year: the year range (four-digit years, at most 100 years).

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("dates")
        >>> batch = task.sample(2, generator=torch.Generator().manual_seed(0))
        >>> src, tgt = task.decode(batch["inputs"][0]), task.decode(batch["targets"][0])
        >>> len(tgt), tgt[4], task.accuracy(batch["targets"], batch)
        (10, '-', 1.0)
    """

    name: ClassVar[str] = "dates"

    min_year: int = 1950
    max_year: int = 2049

    def __post_init__(self):
        check_int("Dates", "min_year", self.min_year, 1000)
        check_int("Dates", "max_year", self.max_year, self.min_year, " (= min_year)")
        if self.max_year > 9999 or self.max_year - self.min_year >= 100:
            raise ArgumentError(f"Dates: max_year must be <= 9999 and < min_year + 100 = {self.min_year + 100} "
                                f"(two-digit years must be unambiguous); got {self.max_year}")

    def chars(self) -> str:
        return _CHARS

    @property
    def max_source_chars(self) -> int:
        return _LONGEST

    @property
    def max_target_chars(self) -> int:
        return 10

    def _pairs(self, n, generator):
        rng = python_rng(generator)
        first = datetime.date(self.min_year, 1, 1)
        span = (datetime.date(self.max_year, 12, 31) - first).days + 1
        sources, targets = [], []
        for _ in range(n):
            day = first + datetime.timedelta(days=rng.randrange(span))
            sources.append(FORMATS[rng.randrange(len(FORMATS))](day))
            targets.append(day.isoformat())
        return sources, targets

    def describe(self) -> str:
        return (f"dates: normalise dates in {len(FORMATS)} human formats to ISO, years {self.min_year}-"
                f"{self.max_year}, vocab {self.vocab_size} (seq2seq; exact match per sequence)")
