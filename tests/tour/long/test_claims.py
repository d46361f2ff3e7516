"""The papers' orderings (src/attnkit/tour/long/claims.py): checked on given numbers, and (slow) on trained runs."""

from __future__ import annotations

import pytest

from attnkit.tour.long import claims
from attnkit.tour.long.claims import CLAIMS, RETRIEVAL_TASKS, check, needed_pairs, needed_speed
from attnkit.tour.long.roster import MECHANISMS

BY_KEY = {c.key: c for c in CLAIMS}


def _acc(values: dict[str, float], task="byte_retrieval") -> dict:
    return {(task, m): [v - 0.01, v, v + 0.01] for m, v in values.items()}


def test_the_claims_name_the_groups_of_the_issue():
    assert RETRIEVAL_TASKS == ("byte_retrieval",)
    glob = BY_KEY["global-beats-local"]
    assert set(glob.better) == {"softmax", "longformer", "bigbird"} and set(glob.worse) == {"local", "sliding-window"}
    assert set(BY_KEY["fixed-state-behind-softmax"].worse) == {"linformer", "performer", "linear"}
    speed = BY_KEY["linear-time-faster"]
    assert speed.worse == ("softmax",) and "softmax" not in speed.better and "linear" in speed.better
    fastest = BY_KEY["kernel-lowrank-window-faster"]
    assert set(fastest.better) == {"linear", "performer", "linformer", "local", "sliding-window", "perceiver"}
    assert set(fastest.better) <= set(speed.better)


def test_an_accuracy_claim_holds_only_when_every_better_mechanism_beats_every_worse_one():
    claim = BY_KEY["global-beats-local"]
    good = {"softmax": 0.9, "longformer": 0.8, "bigbird": 0.75, "local": 0.6, "sliding-window": 0.7}
    verdict = check(claim, _acc(good), {})
    assert verdict.held is True and not verdict.failures and "bigbird 75.0 % (74.0-76.0)" in verdict.detail
    bad = {**good, "bigbird": 0.65}
    verdict = check(claim, _acc(bad), {})
    assert verdict.held is False
    assert verdict.failures == ["byte_retrieval: bigbird (65.0 % (64.0-66.0)) not above sliding-window "
                                "(70.0 % (69.0-71.0))"]
    close = {**good, "bigbird": 0.715}  # its mean is above sliding window's, its worst seed is not above their best
    assert check(claim, _acc(close), {}).held is False
    assert check(claim, _acc({"softmax": 0.9}), {}).held is None  # the others were not measured


def test_the_speed_claim_reads_the_longest_length_measurement():
    claim = BY_KEY["linear-time-faster"]
    speed = {m: 2.0 for m in claim.better} | {"softmax": 1.0}
    assert check(claim, {}, speed).held is True
    speed["reformer"] = 0.5
    verdict = check(claim, {}, speed)
    assert verdict.held is False and verdict.failures == ["at the longest length: reformer (0.50 steps/s) not above "
                                                         "softmax (1.00 steps/s)"]


def test_needed_pairs_cover_every_accuracy_claim_on_every_retrieval_task():
    pairs = needed_pairs()
    for claim in CLAIMS:
        if claim.measure == "accuracy":
            assert {(t, m) for t in RETRIEVAL_TASKS for m in (*claim.better, *claim.worse)} <= set(pairs)
    assert all(m in MECHANISMS for _, m in pairs)
    assert set(needed_speed()) == {*BY_KEY["linear-time-faster"].better, "softmax"}


@pytest.mark.slow
def test_the_orderings_that_reproduce_hold_over_three_seeds(tmp_path):
    """Trains the claims' subset at the suite's default budget (3 seeds) and measures the speeds."""
    from attnkit.tour.long import report, run_suite

    summary = run_suite(tmp_path, pairs=needed_pairs(), seeds=(0, 1, 2), speed=needed_speed(), progress=False)
    assert not summary.failed, summary.failed
    verdicts = {v.claim.key: v for v in report.verdicts(report.load(tmp_path))}
    assert all(v.held is not None for v in verdicts.values()), {k: v.detail for k, v in verdicts.items()}
    for claim in claims.CLAIMS:
        if claim.reproduces:
            assert verdicts[claim.key].held, verdicts[claim.key].failures
