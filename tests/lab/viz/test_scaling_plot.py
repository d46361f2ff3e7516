"""attnkit.lab.viz.scaling_plot: two log-log panels, one line per mechanism, O(L) / O(L^2) guides, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from attnkit.errors import ArgumentError
from attnkit.lab.viz import scaling_plot

SERIES = {
    "dense": [(512, 4e-3, 4 * 2**20), (256, 1e-3, 2**20), (1024, 1.6e-2, 16 * 2**20)],  # unsorted on purpose
    "linear": [(256, 5e-4, None), (512, 1e-3, None), (1024, 2e-3, None)],
}


def _lines(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def test_scaling_plot_draws_time_and_memory_per_mechanism_on_log_axes(tmp_path):
    fig = scaling_plot(SERIES, path=tmp_path / "scaling.png", title="causal, d=64")
    assert (tmp_path / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    time_ax, mem_ax = fig.axes
    for ax in (time_ax, mem_ax):
        assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    time_lines, mem_lines = _lines(time_ax), _lines(mem_ax)
    np.testing.assert_array_equal(time_lines["dense"].get_xdata(), [256, 512, 1024])
    np.testing.assert_allclose(time_lines["dense"].get_ydata(), [1e-3, 4e-3, 1.6e-2])
    np.testing.assert_allclose(time_lines["linear"].get_ydata(), [5e-4, 1e-3, 2e-3])
    np.testing.assert_allclose(mem_lines["dense"].get_ydata(), [1.0, 4.0, 16.0])  # MiB
    assert "linear" not in mem_lines  # no memory measured for it
    assert [t.get_text() for t in time_ax.get_legend().get_texts()][:2] == ["dense", "linear"]
    assert fig.get_suptitle() == "causal, d=64"


def test_reference_guides_have_slopes_one_and_two():
    time_ax = scaling_plot(SERIES).axes[0]
    for label, power in (("∝ L", 1), ("∝ L²", 2)):
        line = _lines(time_ax)[label]
        (x0, x1), (y0, y1) = line.get_xdata(), line.get_ydata()
        assert math.log(y1 / y0) / math.log(x1 / x0) == pytest.approx(power)
        assert (x0, x1) == (256, 1024)
        assert line.get_alpha() < 1  # drawn faintly


def test_memory_panel_says_when_nothing_was_measured():
    fig = scaling_plot({"linear": SERIES["linear"]})
    assert any(t.get_text() == "not measured" for t in fig.axes[1].texts)


@pytest.mark.parametrize(("series", "words"), [
    ({}, "non-empty mapping"),
    ({"a": []}, "has no points"),
    ({"a": [(256, 1e-3)]}, "(L, seconds, peak_bytes | None)"),
    ({"a": [(0, 1e-3, None)]}, "L must be an int >= 1"),
    ({"a": [(256.0, 1e-3, None)]}, "L must be an int >= 1"),
    ({"a": [(256, 0.0, None)]}, "seconds must be a finite number > 0"),
    ({"a": [(256, float("nan"), None)]}, "seconds must be a finite number > 0"),
    ({"a": [(256, None, None)]}, "seconds must be a finite number > 0"),
    ({"a": [(256, 1e-3, -5)]}, "peak_bytes must be a finite number > 0"),
])
def test_scaling_plot_rejects_bad_series(series, words):
    with pytest.raises(ArgumentError) as info:
        scaling_plot(series)
    assert words in str(info.value)


def test_every_series_has_its_own_colour_marker_and_line_style():
    series = {f"m{i}": [(256, 1e-3 * (i + 1), 2**20), (512, 4e-3 * (i + 1), 2**21)] for i in range(12)}
    fig = scaling_plot(series, title="forward + backward; B=1 H=8 D=64 " * 4)
    time_ax = fig.axes[0]
    lines = [line for line in time_ax.get_lines() if line.get_label() in series]
    looks = {(str(line.get_color()), line.get_marker(), line.get_linestyle()) for line in lines}
    assert len(lines) == 12 and len(looks) == 12
    assert len({str(line.get_color()) for line in lines}) == 10  # tab10: the marker tells the 11th from the 1st
    assert "B=1 H=8 D=64" in fig.get_suptitle() and "\n" in fig.get_suptitle()  # long titles are wrapped


def test_series_styles_stay_distinct_well_past_the_colour_count():
    from attnkit.lab.viz._style import series_styles

    styles = series_styles(60)
    assert len({(s["color"], s["marker"], s["linestyle"]) for s in styles}) == 60
