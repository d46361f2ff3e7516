"""Progress bars for long commands and the tour: tqdm when the ``cli`` extra is installed, plain lines otherwise."""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import contextmanager

__all__ = ["progress", "bars", "announce", "duration"]


def progress(total: int | None, desc: str) -> Callable[[str], None]:
    """A ``step(label)`` function advancing a bar of ``total`` steps on stderr."""
    try:
        from tqdm import tqdm
    except ImportError:  # the cli extra is optional: fall back to plain lines
        return lambda label: print(f"  {desc}: {label} ...", file=sys.stderr)
    bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False)

    def step(label: str) -> None:
        bar.set_postfix_str(label)
        bar.update(1)
    return step


@contextmanager
def bars(enabled: bool, total: int | None, desc: str, *, position: int = 0, per_step: bool = False):
    """A progress ``step(label)`` (or None), closed on exit: tqdm when installed, else plain lines per call.

    A per-step bar (``per_step``) is shown only with tqdm: the plain fallback would print a line per step.
    """
    if not enabled:
        yield None
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield None if per_step else progress(total, desc)
        return
    bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False, position=position, dynamic_ncols=True)

    def step(label: str) -> None:
        bar.set_postfix_str(label, refresh=False)
        bar.update(1)
    try:
        yield step
    finally:
        bar.close()


def duration(seconds: float) -> str:
    """``"about N s"``, ``"about N min"`` or ``"about N.N h"``: an estimate in words.

    Example:
        >>> duration(42), duration(1359), duration(4 * 3600)
        ('about 42 s', 'about 23 min', 'about 4.0 h')
    """
    if seconds < 90:
        return f"about {seconds:.0f} s"
    return f"about {seconds / 60:.0f} min" if seconds < 5400 else f"about {seconds / 3600:.1f} h"


def announce(line: str) -> None:
    """A line on stderr before a long job starts (what it will run and about how long), flushed at once."""
    print(line, file=sys.stderr, flush=True)
