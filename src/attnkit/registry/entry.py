"""A registry entry and :func:`register`: what a mechanism's file calls, beside its code.

Entries are explicit (no import-time scanning): a mechanism's file registers one
``Entry(..., spec=Spec(...))`` beside its code, the spec (:mod:`attnkit.costing`) saying
how to count its cost; an entry without a spec is refused. This module imports no
mechanism; :mod:`attnkit.registry` (``get``, ``entries``) loads them all through
:mod:`attnkit.registry.core_entries` and reads what they registered.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ArgumentError

__all__ = ["Entry", "register", "REGISTERED"]


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
    spec: Any = field(default=None, compare=False, kw_only=True)

    def __post_init__(self):
        if self.spec is not None and self.spec.name != self.name:  # the spec answers under the entry's name
            object.__setattr__(self, "spec", dataclasses.replace(self.spec, name=self.name))

    @property
    def import_path(self) -> str:
        """What to import for this entry: the shortest attnkit module exposing ``target`` under its name
        (``attnkit.attention`` for the masks, scores, normalisers and biases that are its arguments).

        Example:
            >>> from attnkit import registry
            >>> registry.get("mamba2").import_path, registry.get("sliding-window").import_path
            ('attnkit.nn.Mamba2Mixer', 'attnkit.attention')
        """
        name, module = getattr(self.target, "__name__", ""), getattr(self.target, "__module__", "") or ""
        parts = module.split(".")
        for end in range(1, len(parts) + 1):
            where = ".".join(parts[:end])
            if getattr(importlib.import_module(where), name, None) is self.target:
                return f"{where}.{name}"
        return f"{module}.{name}"

    def cost(self, *, backward: bool = False, **sizes):
        """The analytic cost of this mechanism, as :func:`attnkit.costing.analytic.cost` gives it.

        Args:
            backward: include the backward pass in the FLOPs.
            sizes: the sizes and options :func:`attnkit.costing.analytic.sizes` lists for this
                entry, or the vocabulary's (``q_len``, ``heads``, ...); registry-example values
                by default, the paper's settings once a length is given; other names raise ArgumentError.

        Returns:
            an :class:`attnkit.costing.spec.Cost` (``flops``, ``other_flops``, ``bytes_moved``,
            ``peak_bytes``, ``terms``, ...).
        """
        return self.spec.cost(sizes, backward=backward)


REGISTERED: dict[str, Entry] = {}


def register(entry: Entry) -> Entry:
    """Add an entry; an entry without a cost spec, or a second entry under the same name, is an error."""
    if entry.spec is None:
        raise ArgumentError(f"registry entry {entry.name!r} has no cost spec: register Entry(..., spec=Spec(...)) "
                            "with the spec written beside the mechanism (attnkit.costing)")
    if entry.name in REGISTERED and REGISTERED[entry.name].target is not entry.target:
        raise ValueError(f"registry name {entry.name!r} is already taken by {REGISTERED[entry.name].target!r}")
    REGISTERED[entry.name] = entry
    return entry
