"""The long suite's report (src/attnkit/tour/long/report.py) from hand-written run records."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from attnkit.lab.tour import store
from attnkit.lab.tour.catalogue import LEFT_OUT
from attnkit.lab.tour.long import report
from attnkit.lab.tour.long.claims import CLAIMS, HELD, check
from attnkit.lab.tour.long.picture import points
from attnkit.lab.tour.long.runner import speed_path
from attnkit.lab.tour.store import FORMAT, run_path, write_json

ACC = {("associative_recall", "softmax"): [0.97, 0.95, 0.99], ("associative_recall", "local"): [0.26, 0.25, 0.24],
       ("associative_recall", "linear"): [0.5, 0.6, 0.55], ("pixel_legend", "softmax"): [0.4, 0.45, 0.5],
       ("pixel_legend", "local"): [0.3, 0.31, 0.29]}
CHANCE = {"associative_recall": 0.25, "pixel_legend": 0.26}
SPEED = {"softmax": 2.0, "local": 5.0, "linear": 6.0}


def _folder(tmp_path):
    keys = list(dict.fromkeys(f"{t}/{m}" for t, m in ACC))
    write_json(tmp_path / "tour.json", {"format": FORMAT, "suite": "long", "mode": "default", "keys": keys,
                                        "seeds": [0, 1, 2], "version": "v", "speed_length": 2048, "workers": 2,
                                        "budgets": {"associative_recall": {"steps": 150, "batch_size": 4, "lr": 0.01}},
                                        "machine": {}, "command": "test", "seconds": 1.0})
    for (task, mech), accs in ACC.items():
        for seed, acc in enumerate(accs):
            result = {"key": f"{task}/{mech}", "task": task, "mechanism": mech, "seed": seed, "accuracy": acc,
                      "train_seconds": 60 / SPEED[mech], "peak_bytes": (4 if mech == "softmax" else 1) * 2**20,
                      "parameters": 1000, "curve": [[50, 1.0, acc / 2], [100, 0.5, acc]],
                      "extra": {"steps_per_second": SPEED[mech], "length": 512, "chance": CHANCE[task]}}
            write_json(run_path(tmp_path, task, mech, seed, "default"),
                       {"format": FORMAT, "key": f"{task}/{mech}", "task": task, "mechanism": mech, "seed": seed,
                        "mode": "default", "version": "v", "status": "ok", "result": result})
    for mech, sps in SPEED.items():
        steps = [1 / (sps / 4 * f) for f in (0.98, 1.0, 1.02)]
        write_json(speed_path(tmp_path, mech, "default"),
                   {"format": FORMAT, "mechanism": mech, "mode": "default", "version": "v", "status": "ok",
                    "result": {"mechanism": mech, "length": 2048, "steps_per_second": 3 / sum(steps),
                               "step_seconds": steps, "peak_bytes": 2**22, "parameters": 1000}})


def test_the_table_shows_chance_and_ceiling_and_marks_accuracies_at_chance(tmp_path):
    _folder(tmp_path)
    rep = report.load(tmp_path)
    table = report.accuracy_table(rep)
    assert table[0][:3] == ["mechanism", "associative_recall", "pixel_legend"]
    assert table[1][:3] == ["chance / ceiling", "25.0 / 100", "26.0 / 100"]
    rows = {row[0]: row for row in table[2:]}
    assert rows["softmax"][1] == "97.0 ± 2.0" and rows["softmax"][2] == "45.0 ± 5.0"
    assert rows["local"][1] == "≈ 25.0 ± 1.0" and rows["linear"][2] == "-"
    assert rows["softmax"][3] == "71.0" and rows["softmax"][4] == "2.00" and rows["softmax"][5] == "4.0"
    pts = {p.mechanism: p for p in points(rep.rows)}
    mean = statistics.fmean([statistics.fmean(ACC["associative_recall", "local"]),
                             statistics.fmean(ACC["pixel_legend", "local"])])
    assert abs(pts["local"].accuracy - mean) < 1e-12 and pts["local"].steps_per_second == 5.0
    assert pts["local"].tasks == 2 and pts["linear"].tasks == 1 and pts["softmax"].peak_bytes == 4 * 2**20
    speed = {row[0]: row for row in report.speed_table(rep)[1:]}
    assert speed["softmax"][:2] == ["softmax", "2048"] and speed["softmax"][2].startswith("0.50 ± ")
    assert speed["local"][3] == "2.50"


def test_each_accuracy_is_read_against_chance():
    assert report.standing([0.97, 0.95, 0.99], 0.25) == "learned"
    assert report.standing([0.26, 0.25, 0.24], 0.25) == "at chance"
    assert report.standing([0.5, 0.6, 0.55], 0.25) == "learned" and report.standing([0.4, 0.42], 0.25) == "partly"


def test_the_report_decides_the_claims_and_lists_what_the_tour_leaves_out(tmp_path):
    _folder(tmp_path)
    markdown, page = report.write(tmp_path)
    text = markdown.read_text()
    verdicts = {v.claim.key: v for v in report.verdicts(report.load(tmp_path))}
    assert set(verdicts) == {c.key for c in CLAIMS}
    assert verdicts["global-beats-local"].outcome is None  # longformer, bigbird, sliding-window were not run
    assert verdicts["kernel-lowrank-window-faster"].outcome is None  # linformer, performer, perceiver not measured
    assert "Welch's t-test" in text and "**not measured**" in text and "## The papers' claims at this scale" in text
    assert "associative_recall: chance 25.0 %" in text and "learned: softmax" in text and "at chance: local" in text
    assert "| softmax | 97.0 ± 2.0 | 45.0 ± 5.0 |" in text and "--quick" not in text
    assert all(f"**{name}**" in text for name in LEFT_OUT) and "img/curves__associative_recall.png" in text
    html = page.read_text()
    assert html.count("data:image/png;base64,") == 3 and "<script src" not in html  # the picture and two curves


def test_after_a_sweep_the_table_and_the_claims_read_each_pairs_best_rate(tmp_path):
    _folder(tmp_path)
    claim = replace(next(c for c in CLAIMS if c.key == "fixed-state-behind-softmax"), worse=("linear",),
                    tasks=("associative_recall",))
    plain = check(claim, report.load(tmp_path).accuracies(), {}, CHANCE)  # the claim on the runs this folder holds
    manifest = store.load_manifest(tmp_path)
    write_json(tmp_path / "tour.json", {**manifest, "lr_scales": list(store.LR_SWEEP)})
    for factor, acc in ((3.0, 0.99), (1 / 3, 0.1)):  # linear recalls at 3x its rate, fails at a third of it
        for seed in range(3):
            rec = store.load_run(run_path(tmp_path, "associative_recall", "linear", seed, "default"))
            write_json(run_path(tmp_path, "associative_recall", "linear", seed, "default", factor),
                       {**rec, "lr_scale": factor, "result": {**rec["result"], "accuracy": acc}})
    rep = report.load(tmp_path)
    assert rep.accuracies()["associative_recall", "linear"] == [0.99, 0.99, 0.99]
    rows = {row[0]: row for row in report.accuracy_table(rep)[2:]}
    assert rows["linear"][1] == "99.0 ± 0.0 (lr x3)" and rows["softmax"][1] == "97.0 ± 2.0"  # softmax: one rate
    swept = check(claim, rep.accuracies(), {}, CHANCE)
    assert plain.outcome == HELD and swept.outcome != HELD  # linear no longer falls behind at its best rate
    assert swept.comparisons[0].difference == pytest.approx(0.97 - 0.99)
