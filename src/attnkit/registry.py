"""The registry: every mechanism by name, with its paper, complexity, an example and its cost spec.

Entries are explicit (no import-time scanning): a mechanism's file registers one
``Entry(..., spec=Spec(...))`` beside its code, the spec (:mod:`attnkit.costing`) saying
how to count its cost; an entry without a spec is refused. ``attnkit list`` prints this
table and :func:`attnkit.analysis.cost.cost` reads the specs from it.

The registry sits below every mechanism (they import it to register) and imports none of
them: :func:`get` and :func:`entries` load :mod:`attnkit.catalog`, which imports them all,
by name on the first look-up.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

from .errors import ArgumentError, did_you_mean

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
        spec: the cost spec (:class:`attnkit.costing.spec.Spec`, keyword only); its name is set to ``name``.

    The entry's cost at given sizes is :meth:`cost` (the analytic cost model).
    """

    name: str
    target: object
    paper: str
    complexity: str
    summary: str
    family: str = "core"
    example: Callable | None = field(default=None, compare=False)
    spec: object = field(default=None, compare=False, kw_only=True)

    def __post_init__(self):
        if self.spec is not None and self.spec.name != self.name:  # the spec answers under the entry's name
            object.__setattr__(self, "spec", dataclasses.replace(self.spec, name=self.name))

    def cost(self, *, backward: bool = False, **sizes):
        """The analytic cost of this mechanism, as :func:`attnkit.analysis.cost.cost` gives it.

        Args:
            backward: include the backward pass in the FLOPs.
            sizes: the sizes and options :func:`attnkit.analysis.cost.sizes` lists for this
                entry, or the vocabulary's (``q_len``, ``heads``, ...); registry-example values
                by default, the paper's settings once a length is given; other names raise ArgumentError.

        Returns:
            an :class:`attnkit.costing.spec.Cost` (``flops``, ``other_flops``, ``bytes_moved``,
            ``peak_bytes``, ``terms``, ...).
        """
        return self.spec.cost(sizes, backward=backward)


_REGISTRY: dict[str, Entry] = {}


def register(entry: Entry) -> Entry:
    """Add an entry; an entry without a cost spec, or a second entry under the same name, is an error."""
    if entry.spec is None:
        raise ArgumentError(f"registry entry {entry.name!r} has no cost spec: register Entry(..., spec=Spec(...)) "
                            "with the spec written beside the mechanism (attnkit.costing)")
    if entry.name in _REGISTRY and _REGISTRY[entry.name].target is not entry.target:
        raise ValueError(f"registry name {entry.name!r} is already taken by {_REGISTRY[entry.name].target!r}")
    _REGISTRY[entry.name] = entry
    return entry


_CATALOG = "attnkit.catalog"  # imports every mechanism module, whose import runs its register() calls


def _load_all() -> None:
    importlib.import_module(_CATALOG)


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
