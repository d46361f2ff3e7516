"""The registry-entry experiments' claims: the decision by Welch's t, and every claim names runs that exist."""

import pytest

from attnkit.errors import ArgumentError
from attnkit.lab.tour import experiments
from attnkit.lab.tour.experiments import positions, recurrences, variants
from attnkit.lab.tour.experiments.claims import Claim, decide, decide_interval
from attnkit.lab.tour.welch import welch

WITHIN = Claim("x matches y", "a paper", "t", "x", "y", "within", 0.1)
ABOVE = Claim("x above y", "a paper", "t", "x", "y")
LEVEL = Claim("x reaches 90 %", "a paper", "t", "x", 0.9)


def test_the_interval_decides_each_kind():
    assert decide_interval("above", 0.01, 0.2, 0.0) == "held"
    assert decide_interval("above", -0.2, -0.01, 0.0) == "did not hold"
    assert decide_interval("above", -0.1, 0.1, 0.0) == "undecided"
    assert decide_interval("within", -0.05, 0.05, 0.1) == "held"
    assert decide_interval("within", 0.12, 0.3, 0.1) == "did not hold"
    assert decide_interval("within", -0.3, -0.1, 0.1) == "did not hold"
    assert decide_interval("within", 0.0, 0.2, 0.1) == "undecided"
    with pytest.raises(ArgumentError, match="kind"):
        decide_interval("below", 0, 1, 0)


def test_decide_uses_welchs_interval():
    a, b = [0.90, 0.92, 0.91], [0.91, 0.93, 0.90]
    w = welch(a, b)
    assert w.low > -0.1 and w.high < 0.1
    result, detail = decide(WITHIN, {"x": a, "y": b})
    assert result == "held" and "inside +-10 points" in detail
    assert decide(WITHIN, {"x": [0.3, 0.35, 0.33], "y": b})[0] == "did not hold"
    assert decide(WITHIN, {"x": [0.5, 0.95, 0.7], "y": b})[0] == "undecided"
    assert decide(ABOVE, {"x": [0.9, 0.95, 0.97], "y": [0.3, 0.35, 0.31]})[0] == "held"
    assert decide(ABOVE, {"y": [0.9, 0.95, 0.97], "x": [0.3, 0.35, 0.31]})[0] == "did not hold"
    result, detail = decide(LEVEL, {"x": [0.95, 0.97, 0.99]})
    assert result == "held" and "the level 90 %" in detail
    assert decide(LEVEL, {"x": [0.5, 0.55, 0.6]})[0] == "did not hold"


def test_a_claim_needs_two_seeds_of_each_mechanism():
    assert decide(ABOVE, {"x": [0.9, 0.9], "y": [0.3]})[0] == "not measured"
    assert decide(LEVEL, {})[0] == "not measured"


@pytest.mark.parametrize("module", [variants, positions, recurrences])
def test_every_claim_names_experiments_that_exist_and_a_source(module):
    exps = experiments()
    for claim in module.CLAIMS:
        assert claim.kind in ("above", "within") and "arXiv" in claim.source
        for mech in claim.mechanisms():
            assert f"{claim.task}/{mech}" in exps, (claim.statement, mech)
    assert set(module.KEYS) <= set(exps)


def test_the_new_experiments_stay_out_of_the_default_tour():
    from attnkit.lab.tour.experiments import default_set

    new = {*variants.KEYS, *positions.KEYS, *recurrences.KEYS}
    assert not new & set(default_set(False)) and not new & set(default_set(True))
