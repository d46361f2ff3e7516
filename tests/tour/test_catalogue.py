"""The tour's catalogue (src/attnkit/tour/catalogue.py): every registry entry is trained somewhere or explained."""

from __future__ import annotations

import inspect

import torch
from torch import nn

from attnkit import registry
from attnkit.tour import catalogue, experiments
from attnkit.tour.long.model import build
from attnkit.tour.long.roster import MECHANISMS, Sizes


def test_every_registry_entry_has_a_tour_experiment_or_a_written_reason():
    missing = catalogue.unexplained()
    assert not missing, (f"registry entries with no tour experiment and no reason in attnkit.tour.catalogue.LEFT_OUT: "
                         f"{', '.join(missing)}")


def test_a_new_entry_without_either_is_named(monkeypatch):
    entries = registry.entries()
    extra = registry.Entry("brand-new", object, "nobody 2099", "O(1)", "a test entry")
    monkeypatch.setattr(registry, "entries", lambda: [*entries, extra])
    assert catalogue.unexplained() == ["brand-new"]


def test_reasons_and_uses_name_real_entries_and_no_used_entry_is_also_left_out():
    names = {e.name for e in registry.entries()}
    used = catalogue.users()
    assert set(catalogue.LEFT_OUT) <= names and set(used) <= names
    assert not set(catalogue.LEFT_OUT) & set(used), set(catalogue.LEFT_OUT) & set(used)
    assert all(len(reason) > 40 for reason in catalogue.LEFT_OUT.values())
    assert any(label.startswith("default: ") for label in used["additive"])
    assert any(label.startswith("long: ") for label in used["reformer"])


def _classes(uses) -> list[type]:
    found = []
    for name in uses:
        target = registry.get(name).target
        if inspect.isclass(target) and issubclass(target, nn.Module):
            found.append(target)
    return found


def test_a_declared_module_is_in_the_experiments_model():
    for key, exp in experiments().items():
        with torch.random.fork_rng(devices=[]):
            model = exp.build().model
        for cls in _classes(exp.uses):
            assert any(isinstance(m, cls) for m in model.modules()), (key, cls.__name__)
    for name, mech in MECHANISMS.items():
        sizes = Sizes(64, 16, 2, side=8)
        model = build(20, 3, sizes, layers=2, ff=32, name=name, per_position=True)
        for cls in _classes(mech.uses):
            assert any(isinstance(m, cls) for m in model.modules()), (name, cls.__name__)
