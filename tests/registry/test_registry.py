"""registry.Entry: no cost formula of its own; Entry.cost reads the spec the entry carries, the one cost model.

Every entry carries its spec (written beside its mechanism); an entry without one is refused.
"""

import dataclasses
import importlib
import subprocess
import sys

import pytest

from attnkit.costing.analytic import Cost, cost
from attnkit.costing.spec import Spec
from attnkit.errors import ArgumentError
from attnkit.registry import Entry, entries, get


def test_an_entry_holds_no_cost_formula():
    assert "cost" not in {f.name for f in dataclasses.fields(Entry)}
    with pytest.raises(TypeError):  # the old eighth positional field is gone
        Entry("x", object, "paper", "O(1)", "summary", "core", None, lambda **sizes: {})


def test_entry_cost_is_the_cost_model_for_every_entry():
    for entry in entries():
        forward, both = entry.cost(), entry.cost(backward=True)
        assert isinstance(forward, Cost) and forward.name == entry.name and not forward.backward
        assert forward == cost(entry.name), entry.name
        assert both == cost(entry.name, backward=True) and both.backward, entry.name


def test_entry_cost_passes_sizes_and_rejects_unknown_ones():
    entry = get("sliding-window")
    c = entry.cost(batch=1, heads=2, q_len=256, head_dim=16, window=8)
    assert c == cost("sliding-window", batch=1, heads=2, q_len=256, head_dim=16, window=8)
    assert c.sizes["q_len"] == 256 and c.flops < entry.cost(batch=1, heads=2, q_len=256, head_dim=16, window=64).flops
    with pytest.raises(ArgumentError, match="unknown size"):
        entry.cost(density=0.1)


def test_every_entry_carries_its_cost_spec_under_its_own_name():
    for entry in entries():
        assert isinstance(entry.spec, Spec), entry.name
        assert entry.spec.name == entry.name and entry.cost().name == entry.name


def test_an_entry_gives_its_name_to_its_spec():
    spec = get("causal").spec
    renamed = Entry("another-causal", object, "paper", "O(1)", "summary", spec=spec)
    assert renamed.spec.name == "another-causal" and spec.name == "causal"


def test_a_mechanism_module_that_registers_an_entry_without_a_spec_fails(tmp_path, monkeypatch):
    (tmp_path / "specless_mechanism.py").write_text(
        "from attnkit.registry.entry import Entry, register\n"
        "register(Entry('specless', object, 'Nobody 2024', 'O(1)', 'an entry with no cost spec', 'module'))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ArgumentError, match="registry entry 'specless' has no cost spec"):
        importlib.import_module("specless_mechanism")
    assert "specless" not in {e.name for e in entries()}


def test_registering_imports_no_mechanism_and_the_registry_sees_every_one():
    """A mechanism's file imports attnkit.registry.entry, which loads no other mechanism; the registry loads them all.

    (``get`` and ``entries`` load them on their first call.)
    """
    probe = ("import sys, attnkit.registry.entry; before = sorted(m for m in sys.modules if m.startswith("
             "('attnkit.nn', 'attnkit.registry.core_entries', 'attnkit.lab.analysis'))); import attnkit.registry as r; "
             "print(before, len(r.entries()) > 40)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["[]", "True"], done.stdout + done.stderr
