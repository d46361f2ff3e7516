"""The registry: every mechanism by name, with its paper, complexity, an example and its cost spec.

:func:`get` and :func:`entries` look mechanisms up; ``attnkit list`` prints the table and
:func:`attnkit.costing.analytic.cost` reads the specs from it. The registry is one package:
:mod:`.entry` holds :class:`Entry` and :func:`register`, what a mechanism's file calls beside its
code (it imports no mechanism, so importing it loads none); :mod:`.core_entries` registers the
options of :func:`attnkit.attention` and imports every mechanism file, which :func:`get` and
:func:`entries` load on their first call, so that every entry is here.
Dependencies point down: mechanisms -> :mod:`.entry` <- :mod:`.core_entries` <- this module.
"""

from __future__ import annotations

from ..errors import did_you_mean
from .entry import REGISTERED, Entry, register

__all__ = ["Entry", "register", "get", "entries"]


def _every_entry() -> dict[str, Entry]:
    """Name -> entry, every mechanism file imported first (once; their register() calls run)."""
    from . import core_entries  # noqa: F401

    return REGISTERED


def get(name: str) -> Entry:
    """The entry called ``name`` (KeyError listing the known names otherwise)."""
    registered = _every_entry()
    if name not in registered:
        raise KeyError(f"unknown mechanism {name!r}; {did_you_mean(name, registered)}"
                       f"known: {', '.join(sorted(registered))}")
    return registered[name]


def entries() -> list[Entry]:
    """Every entry, sorted by family then name."""
    return sorted(_every_entry().values(), key=lambda e: (e.family, e.name))
