"""The tour report's pictures (src/attnkit/tour/report/plots.py): the cost plot's series, the scaling title,
the map pictures' tokens."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("matplotlib")

from attnkit.lab.tour.report import Report, plots

NAMES = ["dense", "sliding-window", "linear-attention", "performer", "sparse-fixed", "additive", "luong",
         "scaled-dot-product", "pointer", "longformer", "linformer", "reformer"]


def _report(tmp_path, costs=(), scaling=None) -> Report:
    return Report(tmp_path, None, [], [], list(costs), scaling)


def test_cost_plot_gives_each_of_twelve_series_its_own_look(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig) or path)
    costs = [{"name": n, "mechanism": f"mech{i}", "sizes": {}, "cost": 1} for i, n in enumerate(NAMES)]
    path, notes = plots.cost_plot(_report(tmp_path, costs))
    assert notes == [] and path.name == "cost.png"
    lines = drawn[0].axes[0].get_lines()
    assert len(lines) == 12
    assert len({(str(line.get_color()), line.get_marker(), line.get_linestyle()) for line in lines}) == 12
    assert "length L" in drawn[0].axes[0].get_title()


def test_scaling_picture_title_names_what_was_measured_and_the_sizes(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig) or path)
    scaling = {"series": {"dense": [[256, 0.1, 2**20], [512, 0.3, 2**22]]}}
    _, notes = plots.scaling_picture(_report(tmp_path, scaling=scaling))
    title = drawn[0].get_suptitle().replace("\n", " ")
    assert notes == [] and "forward + backward" in title and "median of 3" in title and "1 thread" in title
    assert "batch=1" in title and "heads=4" in title  # the tour's sizes, when the cache does not name its own


def test_map_pictures_carry_the_examples_tokens(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig) or path)
    tokens = ["k1", "v1", "k2", "v2", "k1"]
    example = {"title": "example 0", "q_tokens": tokens, "k_tokens": tokens,
               "maps": {"layer 0": torch.softmax(torch.randn(2, 5, 5), -1), "layer 1": torch.rand(2, 3, 4)}}
    plots._picture(example, plots.as_maps(example), tmp_path / "m.png")
    firsts = [ax for ax in drawn[0].axes if ax.get_label() == "head" and ax.get_xlabel()]
    assert [t.get_text() for t in firsts[0].get_yticklabels()] == tokens
    assert [t.get_text() for t in firsts[0].get_xticklabels()] == tokens
    assert "k1" not in [t.get_text() for t in firsts[1].get_yticklabels()]  # 3 queries: positions, not wrong tokens
    assert drawn[0].get_suptitle().startswith("example 0: 2 maps, 2 heads")


def test_learning_curves_of_eighteen_mechanisms_look_apart_and_the_legend_covers_no_step(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig) or path)
    curve = [(step, 3.0 / step, step / 300) for step in range(20, 301, 20)]
    records = [{"status": "ok", "task": "mqar", "mechanism": f"mech-{i}", "result": {"curve": curve}}
               for i in range(18)]
    written, notes = plots.curves(Report(tmp_path, None, records, [], [], None))
    assert notes == [] and [task for task, _ in written] == ["mqar"]
    fig = drawn[0]
    fig.canvas.draw()
    for ax in fig.axes:
        looks = {(str(line.get_color()), line.get_marker(), line.get_linestyle()) for line in ax.get_lines()}
        assert len(ax.get_lines()) == len(looks) == 18  # beyond tab10's ten colours, markers and dashes differ
        assert ax.get_legend() is None  # no legend drawn over the curves
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()] == [f"mech-{i}" for i in range(18)]
    box = legend.get_window_extent()
    assert not any(box.overlaps(ax.get_window_extent()) for ax in fig.axes)  # beside the plots, not on them
