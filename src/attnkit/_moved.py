"""The import paths that moved, kept working for one release with a :class:`DeprecationWarning`.

The workbench (tour, tasks, analysis, viz, the benchmarking code, the command line) moved under
:mod:`attnkit.lab`; the mask machinery of ``attnkit.functional`` moved into the package
:mod:`attnkit.masks`; the recurrences with decays and the delta rule are ``recurrences`` (not
``linear``, the Performer's word); the adapters to torch and transformers moved from ``attnkit.nn``
to :mod:`attnkit.integrations`; the registry is one package, :mod:`attnkit.registry` (``entry.py`` and
``catalog.py`` are its ``entry`` and ``core_entries``); the analytic cost of ``attnkit.analysis.cost``
is :mod:`attnkit.costing.analytic`, beside the cost vocabulary (a module now, so its old submodules
``core`` and ``kv_cache`` are no longer under it: :mod:`attnkit.costing.core_specs`,
:mod:`attnkit.costing.kv_cache`). An import of an old path, ``import attnkit.viz.maps`` or
``from attnkit.tour import catalogue``, warns once and gives the module at its new path: the same
object, never a second copy (``attnkit.viz.maps is attnkit.lab.viz.maps``). The finder is first on
``sys.meta_path`` and answers only the names in :data:`MOVED` and below them.

This module names the lab only as strings; nothing here runs unless an old path is imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__all__ = ["MOVED", "new_name", "install"]

MOVED = {
    "attnkit.tour": "attnkit.lab.tour",
    "attnkit.tasks": "attnkit.lab.tasks",
    "attnkit.analysis": "attnkit.lab.analysis",
    "attnkit.viz": "attnkit.lab.viz",
    "attnkit.benchmarking": "attnkit.lab.benchmarking",
    "attnkit.commands": "attnkit.lab.commands",
    "attnkit.progress": "attnkit.lab.progress",
    "attnkit.cli": "attnkit.lab.cli",
    "attnkit.distributed.bench": "attnkit.lab.benchmarking.distributed",
    "attnkit.functional.mask_base": "attnkit.masks.base",
    "attnkit.functional.mask_parse": "attnkit.masks.parsing",
    "attnkit.functional.indexed_masks": "attnkit.masks.indexed",
    "attnkit.functional.selected_masks": "attnkit.masks.selected",
    "attnkit.functional.document_masks": "attnkit.masks.documents",
    "attnkit.functional.block_masks": "attnkit.masks.block_masks",
    "attnkit.functional.flex_tiles": "attnkit.masks.flex_tiles",
    "attnkit.functional.cache": "attnkit.masks.cache",
    "attnkit.functional.linear": "attnkit.functional.recurrences",
    "attnkit.distributed.decay_linear": "attnkit.distributed.recurrences",
    "attnkit.nn.torch_compat": "attnkit.integrations.torch_compat",
    "attnkit.nn.torch_layers": "attnkit.integrations.torch_layers",
    "attnkit.nn.transformers_layers": "attnkit.integrations.transformers_layers",
    "attnkit.entry": "attnkit.registry.entry",
    "attnkit.catalog": "attnkit.registry.core_entries",
    "attnkit.analysis.cost": "attnkit.costing.analytic",
    "attnkit.functional.recurrences.checks": "attnkit.functional.recurrences.forms",
}
"""Old module path -> new path (a package's submodules follow it)."""


def new_name(name: str) -> str | None:
    """The new path of ``name`` if it (or a package above it) moved, else None.

    >>> new_name("attnkit.viz.maps"), new_name("attnkit.analysis.cost"), new_name("attnkit.masks")
    ('attnkit.lab.viz.maps', 'attnkit.costing.analytic', None)
    """
    for old in sorted(MOVED, key=len, reverse=True):  # the longest old path that holds the name
        if name == old or name.startswith(old + "."):
            return MOVED[old] + name[len(old):]
    return None


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads it as the module at its new path (imported if it is not yet)."""

    def find_spec(self, fullname, path=None, target=None):
        target_name = new_name(fullname)
        if target_name is None:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=target_name)

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {spec.origin}; the old path works until the next release",
                      DeprecationWarning, stacklevel=2)  # warnings skips importlib's frames
        return importlib.import_module(spec.origin)

    def exec_module(self, module):
        """Nothing to run: the module at the new path is already imported."""


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _Alias) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Alias())
