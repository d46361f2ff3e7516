"""costing.spec: one resolution of sizes (example, layer at scale, paper settings, module, given) and Cost."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnkit.costing.spec import MODULE_LENGTH_LIMIT, Spec
from attnkit.costing.tally import Tally
from attnkit.costing.vocabulary import LAYER
from attnkit.errors import ArgumentError


def _count(t: Tally, s, module=None):
    t.mm("x W", 1, s["batch"] * s["length"], s["dim"], s["dim"])


class Toy(torch.nn.Module):
    def __init__(self, dim, window):
        super().__init__()
        self.dim, self.window = dim, window
        self.w = torch.nn.Parameter(torch.zeros(dim, dtype=torch.float64))


SPEC = Spec({"batch": 2, "length": 5, "dim": 6, "heads": 3, "window": 4, "dtype": "float32"}, _count,
            lambda s, m: (m, ()), "2 B n dim^2", make=lambda s: Toy(s["dim"], s["window"]),
            at_scale={"window": 512}, source="Nobody et al. 2024, arXiv:2401.00001, Sec. 1",
            config=lambda m: {"dim": m.dim, "window": m.window}, module_type=Toy, name="toy")


def test_no_size_is_the_example_and_a_length_brings_the_layer_and_the_papers_settings():
    assert SPEC.resolve({}) == dict(SPEC.defaults)
    s = SPEC.resolve({"length": 100})
    assert (s["batch"], s["heads"], s["dim"], s["window"]) == (LAYER["batch"], LAYER["heads"],
                                                               LAYER["heads"] * LAYER["head_dim"], 512)
    assert SPEC.resolve({"q_len": 100}) == s  # the vocabulary's length is this mechanism's one length
    assert SPEC.resolve({"length": 100, "window": 7, "heads": 2})["window"] == 7  # given values win
    assert SPEC.resolve({"length": 100, "heads": 2})["dim"] == 2 * LAYER["head_dim"]  # width = heads x head_dim
    assert SPEC.resolve({"batch": 5})["window"] == 4  # no length given: still the example


def test_a_module_supplies_its_configuration_and_dtype():
    module = Toy(10, 3)
    s = SPEC.resolve({"length": 100}, module)
    assert (s["dim"], s["window"], s["dtype"]) == (10, 3, "float64")
    with pytest.raises(ArgumentError, match="dim come"):
        SPEC.resolve({"dim": 4}, module)


def test_wrong_names_and_values_are_errors_naming_them():
    with pytest.raises(ArgumentError, match=r"unknown size\(s\) windw"):
        SPEC.resolve({"windw": 3})
    with pytest.raises(ArgumentError, match="window=-1"):
        SPEC.resolve({"window": -1})
    with pytest.raises(ArgumentError, match=r"q_len=0\.5"):
        SPEC.resolve({"q_len": 0.5})
    with pytest.raises(ArgumentError, match="toy takes one sequence length"):
        SPEC.resolve({"q_len": 3, "kv_len": 4})


def test_cost_counts_at_the_resolved_sizes_and_builds_a_module_only_when_the_count_reads_it():
    c = SPEC.cost({"length": 100, "dim": 8})
    assert c.name == "toy" and c.flops == 2 * 1 * 100 * 8 * 8 and c.terms == {"x W": c.flops}
    assert SPEC.cost({"length": 10 ** 12}).flops == 2 * 10 ** 12 * 512 * 512  # nothing built: any length
    reading = dataclasses.replace(SPEC, reads_module=True)
    with pytest.raises(ArgumentError, match=f"lengths up to {MODULE_LENGTH_LIMIT}"):
        reading.cost({"length": MODULE_LENGTH_LIMIT + 1})
    assert reading.cost({"length": 7}).flops == SPEC.cost({"length": 7}).flops


def test_the_table_shows_the_decoding_state_and_the_forms_only_where_counted():
    def count(t: Tally, s, module=None):
        _count(t, s)
        t.decoding(fixed=100, per_token=8)
        t.forms.update(one=3, other=4)

    plain = SPEC.cost({"length": 10})
    assert (plain.state_fixed, plain.state_per_token, plain.forms) == (0, 0, {})
    assert "decoding state" not in plain.table() and "by form" not in plain.table()
    c = dataclasses.replace(SPEC, count=count).cost({"length": 10})
    assert (c.state_bytes, c.context, c.forms) == (100 + 8 * 10, 10, {"one": 3, "other": 4})
    lines = c.table().splitlines()
    assert any(line.startswith("decoding state, one sequence at length 10") and line.endswith("180 B")
               for line in lines)
    assert any(line.strip().startswith("per token at this length") and line.endswith(" 18 B") for line in lines)
    assert any(line.strip().startswith("other") and line.endswith(" 4") for line in lines)


def test_the_table_names_the_sizes_given_and_leaves_unset_options_to_the_mechanism():
    from attnkit.costing.analytic import cost

    first = cost("gated-deltanet", q_len=4096).table().splitlines()[0]
    assert first.startswith("gated-deltanet: batch=1") and "heads=8" in first and "None" not in first
