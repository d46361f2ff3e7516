"""``attnkit tour`` (src/attnkit/commands/tour.py): the suite and scale flags, their errors, listing, the README."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnkit.lab.tour.long.suite import plan
from attnkit.lab.tour.store import run_path

from .test_contract import assert_user_error, run


def test_a_bad_suite_name_is_one_line_with_a_suggestion(capsys):
    assert_user_error(["tour", "--suite", "lon"], capsys, "--suite: unknown suite 'lon'", "did you mean 'long'?",
                      "known: default, long")


@pytest.mark.parametrize("scale", ["default", "lra"])
def test_the_long_suite_lists_its_runs_and_its_time(scale, capsys):
    code, out, _ = run(["tour", "--suite", "long", "--scale", scale, "--list"], capsys)
    lines = out.strip().splitlines()
    the_plan = plan(scale)
    assert code == 0 and [line.split()[0] for line in lines[:len(the_plan.pairs)]] == [f"{t}/{m}" for t, m in
                                                                                       the_plan.pairs]
    assert "pixel_legend/lambda" in out or "pixel_images/lambda" in out
    assert lines[-1].startswith(f"{len(the_plan.pairs)} runs x seeds (")
    assert ("one GPU" in lines[-1]) == (scale == "lra")


def test_long_suite_options_are_checked(capsys):
    assert_user_error(["tour", "--suite", "long", "--mechanisms", "linaer"], capsys, "--mechanisms: unknown 'linaer'",
                      "did you mean 'linear'")
    assert_user_error(["tour", "--suite", "long", "--tasks", "byte_context", "--mechanisms", "lambda"], capsys,
                      "no run has task in")
    assert_user_error(["tour", "--suite", "long", "--tasks", "pathfinder"], capsys, "--tasks: unknown 'pathfinder'")
    assert_user_error(["tour", "--suite", "long", "--in-process"], capsys, "--in-process is not available")
    assert_user_error(["tour", "--suite", "long", "--scale", "lr"], capsys, "--scale: unknown scale 'lr'",
                      "did you mean 'lra'")
    assert_user_error(["tour", "--suite", "long", "--scale", "lra", "--quick"], capsys, "--quick is the toy form")
    assert_user_error(["tour", "--scale", "lra"], capsys, "--scale belongs to the long suite")
    assert_user_error(["tour", "--workers", "2", "--in-process"], capsys, "--workers trains runs in processes")
    assert_user_error(["tour", "--device", "tpu"], capsys, "--device")


def test_cuda_without_a_gpu_is_a_user_error(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert_user_error(["tour", "--suite", "long", "--quick", "--device", "cuda", "--out", "unused"], capsys,
                      "no CUDA device")
    assert run(["tour", "--suite", "long", "--scale", "lra", "--device", "cuda", "--list"], capsys)[0] == 0


@pytest.mark.parametrize("suite", ["default", "long"])
def test_a_folder_where_a_run_file_belongs_is_one_line_and_exit_2(suite, tmp_path, capsys):
    argv = ["tour", "--suite", suite, "--quick", "--out", str(tmp_path), "--seeds", "0", "--no-progress"]
    if suite == "long":
        run_path(tmp_path, "byte_context", "softmax", 0, "quick").mkdir(parents=True)
        argv += ["--tasks", "byte_context", "--mechanisms", "softmax"]
    else:
        run_path(tmp_path, "mqar", "softmax-2layer", 0, "quick").mkdir(parents=True)
        argv += ["--tasks", "mqar", "--mechanisms", "softmax-2layer"]
    line = assert_user_error(argv, capsys, "cannot write", "a folder is in the way")
    assert str(tmp_path) in line


def test_the_readme_table_goes_between_its_markers(tmp_path):
    from attnkit.errors import ArgumentError
    from attnkit.lab.commands.tour import _splice

    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- tour:start -->\nold\n<!-- tour:end -->\nrest\n")
    _splice(readme, "tour", "| a |\n|---|")
    assert readme.read_text() == "intro\n<!-- tour:start -->\n| a |\n|---|\n<!-- tour:end -->\nrest\n"
    with pytest.raises(ArgumentError, match="no <!-- tour-long:start -->"):
        _splice(readme, "tour-long", "x")


def test_a_readme_without_the_markers_is_refused_before_any_training(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("no markers\n")
    assert_user_error(["tour", "--suite", "long", "--quick", "--out", str(tmp_path / "out"), "--readme", str(readme)],
                      capsys, "has no <!-- tour-long:start -->")
    assert not (tmp_path / "out").exists()


def test_the_long_suite_command_writes_its_report_and_the_readme_table(tmp_path, monkeypatch, capsys):
    import attnkit.lab.tour.long as long_suite
    from attnkit.lab.tour.store import Summary
    from tests.lab.tour.long.test_report import _folder

    calls = []

    def fake_run_suite(out, **options):  # the saved runs of a finished suite, without training
        calls.append(options)
        _folder(Path(out))
        return Summary(out, options["scale"], ran=["associative_recall/softmax seed 0"])

    monkeypatch.setattr(long_suite, "run_suite", fake_run_suite)
    readme = tmp_path / "README.md"
    readme.write_text("x\n<!-- tour-long:start -->\n<!-- tour-long:end -->\ny\n")
    out = tmp_path / "long"
    code, printed, err = run(["tour", "--suite", "long", "--out", str(out), "--readme", str(readme), "--workers", "1",
                            "--tasks", "associative_recall", "--mechanisms", "softmax", "local", "--no-progress"],
                           capsys)
    assert code == 0, err
    assert str(out / "README.md") in printed and (out / "index.html").exists()
    assert calls[0]["scale"] == "default" and calls[0]["workers"] == 1 and calls[0]["device"] == "cpu"
    assert calls[0]["pairs"] == [("associative_recall", "softmax"), ("associative_recall", "local")]
    assert calls[0]["lr_sweep"] is False
    text = readme.read_text()
    assert text.startswith("x\n<!-- tour-long:start -->\n| mechanism | associative_recall |")
    assert "| chance / ceiling | 25.0 / 100 |" in text and text.endswith("<!-- tour-long:end -->\ny\n")


def test_the_mad_suite_lists_its_task_and_mechanism_pairs_only(capsys):
    from attnkit.lab.tour.experiments.mad import KEYS

    code, out, _ = run(["tour", "--suite", "mad", "--list"], capsys)
    listed = [line.split()[0] for line in out.splitlines() if line.split("/")[0] in {k.split("/")[0] for k in KEYS}]
    assert code == 0 and listed == list(KEYS) and f"{len(KEYS)} experiments, all run by attnkit tour --suite mad" in out


def test_the_list_says_how_many_each_tour_runs(capsys):
    """143 experiments are listed; the closing line says which of them ``attnkit tour`` and ``--quick`` run."""
    from attnkit.lab.tour import runner

    api = runner.api()
    code, out, _ = run(["tour", "--quick", "--list"], capsys)
    last = out.strip().splitlines()[-1]
    assert code == 0 and last == (f"{len(api.experiments())} experiments: {len(api.default_set(False))} run by "
                                  f"attnkit tour, {len(api.default_set(True))} by attnkit tour --quick; --tasks and "
                                  f"--mechanisms pick from all"), last


def test_lr_sweep_reaches_both_tours(tmp_path, monkeypatch, capsys):
    import attnkit.lab.tour.long as long_suite
    from attnkit.lab.tour import runner
    from attnkit.lab.tour.store import Summary
    from tests.lab.tour.long.test_report import _folder

    calls = []

    def fake_run_suite(out, **options):
        calls.append(options)
        _folder(Path(out))
        return Summary(out, options["scale"])

    def fake_tour(keys, seeds, **options):
        calls.append(options)
        return Summary(options["out"], "quick")

    monkeypatch.setattr(long_suite, "run_suite", fake_run_suite)
    monkeypatch.setattr(runner, "tour", fake_tour)
    code, _, err = run(["tour", "--suite", "long", "--out", str(tmp_path / "long"), "--lr-sweep", "--no-progress",
                        "--tasks", "associative_recall", "--mechanisms", "softmax"], capsys)
    assert code == 0, err
    run(["tour", "--quick", "--out", str(tmp_path / "short"), "--lr-sweep", "--no-progress", "--tasks", "mqar"], capsys)
    assert [c["lr_sweep"] for c in calls] == [True, True]


def test_the_mad_suite_trains_one_seed_on_a_cpu_and_measures_no_scaling(tmp_path, monkeypatch, capsys):
    from attnkit.lab.tour import runner
    from attnkit.lab.tour.experiments.mad import default_seeds
    from attnkit.lab.tour.store import Summary

    calls = []

    def fake_tour(keys, seeds, **options):
        calls.append((keys, seeds, options))
        return Summary(options["out"], "default")

    monkeypatch.setattr(runner, "tour", fake_tour)
    for extra in ([], ["--seeds", "0", "1", "2"]):
        code, _, err = run(["tour", "--suite", "mad", "--out", str(tmp_path), "--no-progress", "--tasks", "compression",
                            *extra], capsys)
        assert code == 0, err
    (keys, one, options), (_, three, _) = calls
    assert one == [0] and three == [0, 1, 2] and options["scaling"] is False
    assert keys == [k for k in keys if k.startswith("compression/")] and len(keys) >= 10
    assert default_seeds("cpu") == (0,) and default_seeds("cuda:0") == (0, 1, 2)
