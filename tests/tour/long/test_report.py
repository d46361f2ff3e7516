"""The long suite's report (src/attnkit/tour/long/report.py) from hand-written run records."""

from __future__ import annotations

import statistics

from attnkit.tour.long import report
from attnkit.tour.long.claims import CLAIMS
from attnkit.tour.long.picture import points
from attnkit.tour.long.runner import speed_path
from attnkit.tour.runner import FORMAT, run_path, write_json

ACC = {("byte_retrieval", "softmax"): [0.9, 0.8, 0.85], ("byte_retrieval", "local"): [0.5, 0.6, 0.55],
       ("pixel_images", "softmax"): [0.3, 0.4, 0.5], ("pixel_images", "local"): [0.2, 0.2, 0.2]}
SPEED = {"softmax": 2.0, "local": 5.0}


def _folder(tmp_path):
    keys = list(dict.fromkeys(f"{t}/{m}" for t, m in ACC))
    write_json(tmp_path / "tour.json", {"format": FORMAT, "suite": "long", "mode": "default", "keys": keys,
                                        "seeds": [0, 1, 2], "version": "v", "speed_length": 2048,
                                        "budget": {"steps": 60, "batch_size": 8, "lr": 0.003}, "machine": {},
                                        "command": "test", "seconds": 1.0})
    for (task, mech), accs in ACC.items():
        for seed, acc in enumerate(accs):
            result = {"key": f"{task}/{mech}", "task": task, "mechanism": mech, "seed": seed, "accuracy": acc,
                      "train_seconds": 60 / SPEED[mech], "peak_bytes": (4 if mech == "softmax" else 1) * 2**20,
                      "parameters": 1000, "extra": {"steps_per_second": SPEED[mech], "length": 512}}
            write_json(run_path(tmp_path, task, mech, seed, "default"),
                       {"format": FORMAT, "key": f"{task}/{mech}", "task": task, "mechanism": mech, "seed": seed,
                        "mode": "default", "version": "v", "status": "ok", "result": result})
    for mech, sps in SPEED.items():
        write_json(speed_path(tmp_path, mech, "default"),
                   {"format": FORMAT, "mechanism": mech, "mode": "default", "version": "v", "status": "ok",
                    "result": {"mechanism": mech, "length": 2048, "steps_per_second": sps / 4,
                               "peak_bytes": 2**22, "parameters": 1000}})


def test_the_table_and_the_picture_average_over_seeds_then_tasks(tmp_path):
    _folder(tmp_path)
    rep = report.load(tmp_path)
    table = report.accuracy_table(rep)
    assert table[0][:3] == ["mechanism", "byte_retrieval", "pixel_images"]
    softmax = next(row for row in table if row[0] == "softmax")
    assert softmax[1] == "85.0 ± 5.0" and softmax[2] == "40.0 ± 10.0"
    assert softmax[3] == "62.5" and softmax[4] == "2.00" and softmax[5] == "4.0"
    pts = {p.mechanism: p for p in points(rep.rows)}
    mean = statistics.fmean([statistics.fmean(ACC["byte_retrieval", "local"]), statistics.fmean(ACC["pixel_images",
                                                                                                    "local"])])
    assert abs(pts["local"].accuracy - mean) < 1e-12 and pts["local"].steps_per_second == 5.0
    assert pts["local"].tasks == 2 and pts["softmax"].peak_bytes == 4 * 2**20
    speed = report.speed_table(rep)
    assert speed[1] == ["softmax", "2048", "0.50", "1.00", "4.0"] and speed[2][3] == "2.50"


def test_the_report_says_which_claims_held_and_embeds_its_picture(tmp_path):
    _folder(tmp_path)
    markdown, page = report.write(tmp_path)
    text = markdown.read_text()
    verdicts = {v.claim.key: v for v in report.verdicts(report.load(tmp_path))}
    assert set(verdicts) == {c.key for c in CLAIMS}
    assert verdicts["global-beats-local"].held is None  # longformer, bigbird, sliding-window were not run
    assert "**not measured**" in text and "## The papers' claims at this scale" in text
    assert "| softmax | 85.0 ± 5.0 | 40.0 ± 10.0 |" in text and "--quick" not in text
    html = page.read_text()
    assert html.count("data:image/png;base64,") == 1 and "<script src" not in html
