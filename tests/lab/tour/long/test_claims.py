"""The papers' orderings (src/attnkit/tour/long/claims.py): decided from the spread over seeds, and (slow) trained."""

from __future__ import annotations

import math

import pytest

from attnkit.lab.tour.long import claims
from attnkit.lab.tour.long.claims import (
    CLAIMS,
    HELD,
    NOT_HELD,
    RETRIEVAL_TASKS,
    UNDECIDED,
    at_chance,
    check,
    compare,
    needed_pairs,
)
from attnkit.lab.tour.long.roster import MECHANISMS
from attnkit.lab.tour.long.suite import CLAIMED, plan
from attnkit.lab.tour.welch import welch

BY_KEY = {c.key: c for c in CLAIMS}
CHANCE = {"associative_recall": 0.25}


def _acc(values: dict[str, float], task="associative_recall") -> dict:
    return {(task, m): [v - 0.01, v, v + 0.01] for m, v in values.items()}


def test_the_claims_name_the_groups_of_the_papers():
    assert set(RETRIEVAL_TASKS) >= {"associative_recall", "pixel_legend"}
    glob = BY_KEY["global-beats-local"]
    assert set(glob.better) == {"softmax", "longformer", "bigbird"} and set(glob.worse) == {"local", "sliding-window"}
    assert set(BY_KEY["fixed-state-behind-softmax"].worse) == {"linformer", "performer", "linear"}
    speed = BY_KEY["linear-time-faster"]
    assert speed.worse == ("softmax",) and "softmax" not in speed.better and "linear" in speed.better
    fastest = BY_KEY["kernel-lowrank-window-faster"]
    assert set(fastest.better) == {"linear", "performer", "linformer", "local", "sliding-window", "perceiver"}
    assert set(fastest.better) <= set(speed.better)
    chosen = BY_KEY["chosen-blocks-recall"]
    assert (chosen.better, chosen.worse, chosen.tasks) == (("softmax", "nsa", "moba"), ("sliding-window",),
                                                           ("associative_recall",))
    assert all(c.tasks == RETRIEVAL_TASKS for c in CLAIMS if c is not chosen)


def test_a_difference_beyond_the_noise_holds_and_a_lead_below_the_margin_does_not():
    assert compare("t", "a", "b", [0.9, 0.92, 0.94], [0.5, 0.52, 0.48], chance=0.25).outcome == HELD
    # both at the ceiling: no lead at all, established
    assert compare("t", "a", "b", [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], chance=0.25).outcome == NOT_HELD
    # the other way round, beyond the noise
    assert compare("t", "a", "b", [0.6, 0.62, 0.61], [0.9, 0.91, 0.92], chance=0.25).outcome == NOT_HELD
    noisy = compare("t", "a", "b", [0.9, 0.7, 0.8], [0.75, 0.85, 0.7], chance=0.25)
    assert noisy.outcome == UNDECIDED and noisy.reason == "the difference is within the noise"


def test_runs_at_chance_or_of_one_seed_decide_nothing():
    flat = compare("t", "a", "b", [0.26, 0.24, 0.25], [0.20, 0.21, 0.19], chance=0.25)
    assert flat.outcome == UNDECIDED and "within the noise of chance" in flat.reason
    barely = compare("t", "a", "b", [0.28, 0.28, 0.28], [0.20, 0.20, 0.20], chance=0.25)  # 3 points: not learned
    assert barely.outcome == UNDECIDED
    one = compare("t", "a", "b", [0.9], [0.3], chance=0.25)
    assert one.outcome == UNDECIDED and "no spread" in one.reason


def test_the_interval_is_welchs_on_the_difference_of_means():
    a, b = [0.92, 0.88, 0.95], [0.61, 0.55, 0.70]
    c = compare("t", "a", "b", a, b, chance=0.25)
    mean_a, mean_b = sum(a) / 3, sum(b) / 3
    w = welch(a, b)
    assert c.difference == pytest.approx(mean_a - mean_b) and c.interval == (w.low, w.high)
    assert "95 % interval" in c.text("accuracy") and "+29.7 points" in c.text("accuracy")


def test_a_claim_holds_when_every_pair_held_and_fails_when_one_did_not():
    claim = BY_KEY["global-beats-local"]
    good = {"softmax": 0.95, "longformer": 0.8, "bigbird": 0.75, "local": 0.26, "sliding-window": 0.27}
    verdict = check(claim, _acc(good), {}, CHANCE)
    assert verdict.outcome == HELD and verdict.held is True and len(verdict.comparisons) == 6
    bad = {**good, "bigbird": 0.2}
    assert check(claim, _acc(bad), {}, CHANCE).outcome == UNDECIDED  # bigbird at chance: decides nothing
    worse = {**good, "bigbird": 0.5, "sliding-window": 0.8}
    verdict = check(claim, _acc(worse), {}, CHANCE)
    assert verdict.outcome == NOT_HELD and verdict.held is False
    partial = check(claim, _acc({"softmax": 0.9}), {}, CHANCE)
    assert partial.outcome is None and "associative_recall: longformer" in partial.missing


def test_within_the_noise_of_chance_is_less_than_five_points_above_it_or_an_interval_reaching_it():
    assert at_chance([0.26, 0.24, 0.25], 0.25) and at_chance([0.29, 0.29, 0.29], 0.25)  # 4 points: not learned
    assert at_chance([0.9, 0.2, 0.5], 0.25)  # far above on average, but the spread reaches chance
    assert not at_chance([0.31, 0.30, 0.32], 0.25) and not at_chance([0.97, 0.95], 0.25)


def test_the_chosen_blocks_claim_reads_the_recall_alone():
    claim = BY_KEY["chosen-blocks-recall"]
    good = {"softmax": 0.95, "nsa": 0.9, "moba": 0.85, "sliding-window": 0.26}
    legend = _acc({"softmax": 0.9, "sliding-window": 0.5}, task="pixel_legend")  # no NSA or MoBA there: not read
    verdict = check(claim, _acc(good) | legend, {}, CHANCE | {"pixel_legend": 0.3})
    assert verdict.outcome == HELD and verdict.missing == []
    assert {(c.where, c.better, c.worse) for c in verdict.comparisons} == {
        ("associative_recall", m, "sliding-window") for m in ("softmax", "nsa", "moba")}
    verdict = check(claim, _acc({**good, "moba": 0.5, "sliding-window": 0.7}), {}, CHANCE)
    assert verdict.outcome == NOT_HELD
    assert [c.better for c in verdict.comparisons if c.outcome == NOT_HELD] == ["moba"]
    assert check(claim, _acc({k: v for k, v in good.items() if k != "nsa"}), {}, CHANCE).missing == [
        "associative_recall: nsa"]


def test_a_speed_claim_reads_the_timed_steps():
    claim = BY_KEY["linear-time-faster"]
    speed = {m: [2.0, 2.1, 1.9] for m in claim.better} | {"softmax": [1.0, 1.05, 0.95]}
    assert check(claim, {}, speed).outcome == HELD
    speed["reformer"] = [0.5, 0.52, 0.48]
    verdict = check(claim, {}, speed)
    assert verdict.outcome == NOT_HELD
    assert [c.better for c in verdict.comparisons if c.outcome == NOT_HELD] == ["reformer"]
    assert check(claim, {}, {"softmax": [1.0]}).outcome is None


def test_the_default_scale_trains_what_the_claims_compare():
    the_plan = plan()
    for task, mech in needed_pairs():
        assert (task, mech) in the_plan.pairs and len(the_plan.setup(task).seeds) >= 3
    assert ("associative_recall", "nsa") in needed_pairs() and ("pixel_legend", "nsa") not in needed_pairs()
    assert ("pixel_legend", "sliding-window") in needed_pairs()
    assert set(CLAIMED) == {m for c in CLAIMS if c.measure == "accuracy" for m in (*c.better, *c.worse)}
    assert all(m in MECHANISMS for m in CLAIMED)


@pytest.mark.slow
def test_one_task_two_mechanisms_one_seed_keep_the_claimed_ordering(tmp_path):
    """Trains softmax and local attention on the default scale's associative recall (seed 0): the global-beats-local
    claim's ordering, with softmax learning the task (chance + 25 points) and local attention at chance."""
    from attnkit.lab.tour.long import report, run_suite

    summary = run_suite(tmp_path, pairs=[("associative_recall", "softmax"), ("associative_recall", "local")],
                        seeds=(0,), speed=(), progress=False, workers=1)
    assert not summary.failed, summary.failed
    rep = report.load(tmp_path)
    acc, chance = rep.accuracies(), rep.chance()["associative_recall"]
    softmax, local = acc["associative_recall", "softmax"][0], acc["associative_recall", "local"][0]
    assert softmax >= chance + 0.25 and softmax > local + 0.25, (softmax, local, chance)
    assert claims.compare("associative_recall", "softmax", "local", [softmax], [local], chance=chance).outcome \
        == UNDECIDED  # one seed: shown, not decided


def test_an_undecided_pair_says_which_runs_would_decide_it():
    from attnkit.lab.tour.long.claims import MOST_SEEDS, UNDECIDED, compare, deciding_runs

    at_chance = compare("associative_recall", "longformer", "local", [0.24, 0.25, 0.23], [0.25, 0.24, 0.26],
                        chance=0.25)
    assert at_chance.outcome == UNDECIDED and at_chance.decide.startswith("a longer budget")
    assert "would be decided by a longer budget" in at_chance.text("accuracy")
    noisy = compare("pixel_legend", "softmax", "local", [0.70, 0.62, 0.78], [0.45, 0.70, 0.55], chance=0.25)
    assert noisy.outcome == UNDECIDED and noisy.decide.startswith("more seeds: about ")
    seeds = int(noisy.decide.split("about ")[1].split()[0])
    half, needed = (noisy.interval[1] - noisy.interval[0]) / 2, noisy.difference
    assert seeds == max(4, math.ceil(3 * (half / needed) ** 2))  # the half-width shrinks as 1 / sqrt(seeds)
    one = compare("t", "softmax", "local", [0.9], [0.3], chance=0.25)
    assert one.decide == "more seeds: 3 or more per mechanism"
    held = compare("t", "softmax", "local", [0.97, 0.95, 0.99], [0.26, 0.25, 0.24], chance=0.25)
    assert held.decide == "" and "would be decided" not in held.text("accuracy")
    assert deciding_runs(0.01, (-0.5, 0.52), 3, 0.02).startswith(f"neither more seeds (over {MOST_SEEDS}")
