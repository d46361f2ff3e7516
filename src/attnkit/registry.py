"""The registry: every mechanism by name, with its paper, complexity and an example.

Entries are explicit (no import-time scanning): a new mechanism adds one
:func:`register` call beside its code. ``attnkit list`` prints this table.
An entry holds no cost formula: :meth:`Entry.cost` reads the one cost model,
:func:`attnkit.analysis.cost.cost`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import did_you_mean

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

    The entry's cost at given sizes is :meth:`cost` (the analytic cost model).
    """

    name: str
    target: object
    paper: str
    complexity: str
    summary: str
    family: str = "core"
    example: Callable | None = field(default=None, compare=False)

    def cost(self, *, backward: bool = False, **sizes):
        """The analytic cost of this mechanism: ``attnkit.analysis.cost.cost(self.name, ...)``.

        Args:
            backward: include the backward pass in the FLOPs.
            sizes: the sizes and options :func:`attnkit.analysis.cost.sizes` lists for this
                entry (registry-example values by default); other names raise ArgumentError.

        Returns:
            an :class:`attnkit.analysis.cost.Cost` (``flops``, ``other_flops``, ``bytes_moved``,
            ``peak_bytes``, ``terms``, ...).
        """
        from .analysis.cost import cost  # imported here: the registry sits below analysis in the import order

        return cost(self.name, backward=backward, **sizes)


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
        raise KeyError(f"unknown mechanism {name!r}; {did_you_mean(name, _REGISTRY)}"
                       f"known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def entries() -> list[Entry]:
    """Every entry, sorted by family then name."""
    _load_all()
    return sorted(_REGISTRY.values(), key=lambda e: (e.family, e.name))
