"""``attnkit tour --suite`` (src/attnkit/commands/tour.py): the suite flag, its errors and its listing."""

from __future__ import annotations

from attnkit.tour.long.suite import plan

from .test_contract import assert_user_error, run


def test_a_bad_suite_name_is_one_line_with_a_suggestion(capsys):
    assert_user_error(["tour", "--suite", "lon"], capsys, "--suite: unknown suite 'lon'", "did you mean 'long'?",
                      "known: default, long")


def test_the_long_suite_lists_its_runs(capsys):
    code, out, _ = run(["tour", "--suite", "long", "--list"], capsys)
    lines = out.strip().splitlines()
    assert code == 0 and lines[:len(plan(False).pairs)] == [f"{t}/{m}" for t, m in plan(False).pairs]
    assert "pixel_images/lambda" in lines and "byte_text/lambda" not in lines
    assert lines[-1] == f"{len(plan(False).pairs)} runs x seeds 0, 1, 2"


def test_long_suite_options_are_checked(capsys):
    assert_user_error(["tour", "--suite", "long", "--mechanisms", "linaer"], capsys, "--mechanisms: unknown 'linaer'",
                      "did you mean 'linear'")
    assert_user_error(["tour", "--suite", "long", "--tasks", "byte_text", "--mechanisms", "lambda"], capsys,
                      "no run has task in")
    assert_user_error(["tour", "--suite", "long", "--in-process"], capsys, "--in-process is not available")
