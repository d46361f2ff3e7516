"""The registry: every mechanism by name, with its paper, complexity, an example and its cost spec.

:func:`get` and :func:`entries` look mechanisms up; ``attnkit list`` prints the table and
:func:`attnkit.lab.analysis.cost.cost` reads the specs from it. A mechanism registers itself
beside its code with :func:`attnkit.entry.register`; this module imports :mod:`attnkit.catalog`,
which imports every mechanism file, so that every entry is here. Dependencies point down:
mechanisms -> :mod:`attnkit.entry` <- :mod:`attnkit.catalog` <- this module.
"""

from __future__ import annotations

from . import catalog  # noqa: F401  (imports every mechanism module: their register() calls run)
from .entry import REGISTERED, Entry, register
from .errors import did_you_mean

__all__ = ["Entry", "register", "get", "entries"]


def get(name: str) -> Entry:
    """The entry called ``name`` (KeyError listing the known names otherwise)."""
    if name not in REGISTERED:
        raise KeyError(f"unknown mechanism {name!r}; {did_you_mean(name, REGISTERED)}"
                       f"known: {', '.join(sorted(REGISTERED))}")
    return REGISTERED[name]


def entries() -> list[Entry]:
    """Every entry, sorted by family then name."""
    return sorted(REGISTERED.values(), key=lambda e: (e.family, e.name))
