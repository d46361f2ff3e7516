"""The registry: every mechanism by name, with its paper, complexity and an example.

Entries are explicit (no import-time scanning): a new mechanism adds one
:func:`register` call beside its code. ``attnkit list`` prints this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Entry", "register", "get", "entries"]


@dataclass(frozen=True)
class Entry:
    """One mechanism.

    Attributes:
        name: registry key, kebab-case (``"sliding-window"``).
        target: the class or function implementing it.
        paper: authors, year and arXiv id or venue.
        complexity: time class in the sequence lengths, e.g. ``"O(Lq Lk D)"``.
        summary: one line.
        family: grouping for listings ("core", "score", "mask", "module", ...).
        example: builds ``(callable, inputs)`` for a small run: ``callable(*inputs)``.
        cost: optional ``cost(**sizes) -> dict`` of FLOPs/bytes formulas.
    """

    name: str
    target: object
    paper: str
    complexity: str
    summary: str
    family: str = "core"
    example: Callable | None = field(default=None, compare=False)
    cost: Callable | None = field(default=None, compare=False)


_REGISTRY: dict[str, Entry] = {}


def register(entry: Entry) -> Entry:
    """Add an entry; a second entry under the same name is an error."""
    if entry.name in _REGISTRY and _REGISTRY[entry.name].target is not entry.target:
        raise ValueError(f"registry name {entry.name!r} is already taken by {_REGISTRY[entry.name].target!r}")
    _REGISTRY[entry.name] = entry
    return entry


def _load_all() -> None:
    # Importing a module runs its register() calls; the list is explicit on purpose.
    from . import catalog  # noqa: F401


def get(name: str) -> Entry:
    """The entry called ``name`` (KeyError listing the known names otherwise)."""
    _load_all()
    if name not in _REGISTRY:
        raise KeyError(f"unknown mechanism {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def entries() -> list[Entry]:
    """Every entry, sorted by family then name."""
    _load_all()
    return sorted(_REGISTRY.values(), key=lambda e: (e.family, e.name))
