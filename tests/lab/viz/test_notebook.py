"""viz/notebook.py: a recording displayed in a notebook (the viewer pooled to fit, a PNG, none without matplotlib)."""

from __future__ import annotations

import pytest
import torch

from attnkit.lab.analysis.recorder import AttentionRecorder
from attnkit.lab.viz import show
from attnkit.lab.viz.notebook import NOTEBOOK_WEIGHTS


def test_notebooks_show_the_viewer_pooled_to_fit_and_a_png():
    import html as html_lib

    from tests.lab.analysis.test_recorder import _model_like
    from tests.lab.viz.test_html import _data

    big = AttentionRecorder.from_maps({"long": torch.softmax(torch.randn(1, 12, 400, 400), -1)})  # 1.9M weights
    frame = show(big)._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and "<script" not in frame  # the page is an escaped attribute
    page = html_lib.unescape(frame.split('srcdoc="', 1)[1].split('" style=', 1)[0])
    (m,) = _data(page)["maps"]
    assert m["n"] == [400, 400] and 12 * m["lq"] * m["lk"] <= NOTEBOOK_WEIGHTS < 12 * (m["lq"] + 1) ** 2
    assert _data(page)["scale"] == "log"
    assert "no attention map" in show(AttentionRecorder())._repr_html_()
    pytest.importorskip("matplotlib")
    small, _ = _model_like()
    assert show(small)._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n" and show(AttentionRecorder())._repr_png_() is None


def test_without_matplotlib_a_notebook_gets_no_png(monkeypatch):
    import sys

    from tests.lab.analysis.test_recorder import _model_like

    rec, _ = _model_like()
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert show(rec)._repr_png_() is None
