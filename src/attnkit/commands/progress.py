"""Progress bars for long commands: tqdm when the ``cli`` extra is installed, plain lines otherwise."""

from __future__ import annotations

import sys
from collections.abc import Callable


def progress(total: int, desc: str) -> Callable[[str], None]:
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
