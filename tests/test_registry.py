"""registry.Entry: no cost formula of its own; Entry.cost reads the one cost model (attnkit.analysis.cost)."""

import dataclasses

import pytest

from attnkit.analysis.cost import Cost, cost
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
