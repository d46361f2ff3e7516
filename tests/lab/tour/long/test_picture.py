"""The long suite's LRA picture (src/attnkit/tour/long/picture.py): one bubble per mechanism, labels apart."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from attnkit.lab.tour.long import picture


def test_labels_of_bubbles_on_top_of_each_other_do_not_overlap(tmp_path, monkeypatch):
    figures = []
    real = picture._labels
    monkeypatch.setattr(picture, "_labels", lambda fig, ax, pts, areas: figures.append(fig) or real(fig, ax, pts,
                                                                                                       areas))
    # the committed report's crowded corners: two bubbles at almost one place, two more side by side
    pts = [picture.Point("sliding-window", 0.332, 23.4, 134 * 2**20, 3),
           picture.Point("local", 0.333, 27.2, 145 * 2**20, 3),
           picture.Point("moba", 0.869, 1.10, 472 * 2**20, 1), picture.Point("nsa", 0.816, 1.18, 472 * 2**20, 1),
           picture.Point("block-sparse", 0.653, 14.1, 140 * 2**20, 2),
           picture.Point("sparse-strided", 0.663, 18.6, 149 * 2**20, 2), picture.Point("softmax", 0.923, 12.7, None, 3)]
    path = picture.draw(pts, tmp_path / "lra.png", title="t")
    assert path.read_bytes()[:4] == b"\x89PNG"
    fig = figures[0]
    texts = [t for t in fig.axes[0].texts]
    assert sorted(t.get_text().split("\n")[0] for t in texts) == sorted(p.mechanism for p in pts)
    boxes = [t.get_window_extent() for t in texts]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert texts[[t.get_text().split("\n")[0] for t in texts].index("softmax")].get_text() == "softmax"  # no memory
