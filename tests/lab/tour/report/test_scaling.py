"""The measured-scaling fit of the tour report (src/attnkit/tour/report/scaling.py): the power-law fit, its
R^2, and the rule that shows a fit as "noisy" instead of a number."""

import math
import random

import pytest

from attnkit.lab.tour.report import scaling

LENGTHS = [256, 512, 1024, 2048]


def test_a_clean_power_law_gives_its_exponent_and_r_squared_one():
    times = [3e-9 * n ** 2 for n in LENGTHS]
    fit = scaling.power_fit(LENGTHS, times)
    assert fit.exponent == pytest.approx(2.0, abs=1e-9) and fit.r_squared == pytest.approx(1.0, abs=1e-12)
    assert scaling.exponent_text(LENGTHS, times, [0.1 * t for t in times]) == "2.00"


def test_r_squared_by_hand():
    # log2 values 0, 2, 1 at log2 L = 0, 1, 2: slope 0.5, mean 1, residuals -0.5, 1, -0.5
    # (in natural-log units, both sums scale by ln(2)^2): SS_res = 1.5, SS_tot = 2, R^2 = 0.25
    fit = scaling.power_fit([1, 2, 4], [1, 4, 2])
    assert fit.exponent == pytest.approx(0.5) and fit.r_squared == pytest.approx(0.25)
    assert scaling.exponent_text([1, 2, 4], [1, 4, 2]) == "noisy (R² 0.25 of a power law)"


def test_a_scrambled_set_is_noisy_never_a_number():
    rng = random.Random(0)
    times = [3e-9 * n ** 2 for n in LENGTHS]
    noisy = 0
    for _ in range(20):
        shuffled = rng.sample(times, len(times))
        fit = scaling.power_fit(LENGTHS, shuffled)
        text = scaling.exponent_text(LENGTHS, shuffled)
        if fit.r_squared < scaling.MIN_R_SQUARED:
            assert text == f"noisy (R² {fit.r_squared:.2f} of a power law)"  # the reason, not the exponent
            noisy += 1
        elif any(b < a / 2 for i, a in enumerate(shuffled) for b in shuffled[i + 1:]):
            assert text.startswith("noisy (L=")  # a longer length in under half the time: a disturbed point
            noisy += 1
        else:
            assert text == f"{fit.exponent:.2f}"
    assert noisy >= 15  # most orders of four points spanning 64x are far from a line
    # the committed report's linear-attention row (812, 768, 201, 480 ms): exponent -0.42 with R^2 ~0.2
    assert scaling.exponent_text(LENGTHS, [0.812, 0.768, 0.2012, 0.4799]).startswith("noisy (R²")


def test_a_wide_spread_is_noisy_even_when_the_medians_fit():
    times = [1e-6 * n for n in LENGTHS]
    spreads = [0.0, 0.0, 0.6 * times[2], 0.0]  # 60 % of its median > MAX_RELATIVE_SPREAD
    assert scaling.exponent_text(LENGTHS, times, spreads) == "noisy (spread 60 % of the median)"
    assert scaling.exponent_text(LENGTHS, times, [0.4 * t for t in times]) == "1.00"


def test_too_few_points_have_no_exponent():
    assert scaling.power_fit([256], [1.0]) is None
    assert scaling.exponent_text([256, 512], [1.0, None]) == "n/a"
    flat = scaling.power_fit([256, 512], [2.0, 2.0])
    assert flat.exponent == 0.0 and flat.r_squared == 1.0 and math.isfinite(flat.r_squared)


def test_scaling_markdown_shows_spread_and_statuses():
    data = {"lengths": [256, 512, 1024], "repeats": 3, "threads": 1, "sizes": {"batch": 1},
            "points": {"dense": [[256, 0.001, 0.0002, 2**20, "ok"], [512, 0.004, 0.0004, 2**22, "ok"],
                                 [1024, None, None, None, "timeout"]]}}
    text = scaling.scaling_markdown(data)
    assert "| dense | 1.0 ± 0.1 | 4.0 ± 0.2 | timeout | 1.0 | 4.0 | timeout | 2.00 | 2.00 |" in text
    assert "fresh process at 1 thread(s): median of 3" in text
    assert scaling.scaling_markdown({"series": {"dense": [[256, 0.1, None]]}}) == ""  # no repeats: not shown


def test_a_longer_length_in_under_half_the_time_is_noisy_in_the_tour_and_on_the_command_line():
    from attnkit.lab.analysis.scaling import ScalingRow, ScalingTable

    # the sliding window a user saw: 356.8 ms at 1024 tokens, 107.7 ms at 2048 (two points: R² is 1 whatever they are)
    lengths, times = [1024, 2048], [0.3568, 0.1077]
    assert scaling.exponent_text(lengths, times) == "noisy (L=2048 takes 30 % of L=1024)"
    table = ScalingTable(tuple(ScalingRow("window", n, t, 0.01 * t, None) for n, t in zip(lengths, times, strict=True)),
                         tuple(lengths))
    assert table.exponent_text("window") == "noisy (L=2048 takes 30 % of L=1024)"
    assert "noisy (L=2048" in table.markdown()
    steady = ScalingTable(tuple(ScalingRow("dense", n, 1e-7 * n * n, 0.0, None) for n in lengths), tuple(lengths))
    assert steady.exponent_text("dense") == "2.00"
    shaky = ScalingTable(tuple(ScalingRow("dense", n, 1e-7 * n * n, 0.8e-7 * n * n, None) for n in lengths),
                         tuple(lengths))
    assert shaky.exponent_text("dense") == "noisy (spread 80 % of the median)"  # the spread rule, shared
