"""benchmarks/linear_forms.py at tiny sizes: every cell is measured or skipped with its reason (nothing is timed)."""

import contextlib
import dataclasses
import io

import pytest

from benchmarks import linear_forms

TINY = linear_forms.Config(lengths=(16, 40), heads=2, head_dim=8, chunk_size=8, repeats=1, budget_s=0.5,
                           max_gib=3e-5)  # the parallel form fits at L = 16 (1.1e-5 GiB), not at 40 (7.2e-5)


def _in_process(config, length, form):
    """What the child process answers, from this process (a fresh interpreter per cell is the slow test's)."""
    return linear_forms.child({"config": dataclasses.asdict(config), "length": length, "form": form})


def _check(rows):
    assert [r["length"] for r in rows] == [16, 40]
    assert set(rows[0]["train_s"]) == set(rows[0]["peak_bytes"]) == {"chunk", "parallel"}
    assert set(rows[1]["train_s"]) == set(rows[1]["peak_bytes"]) == {"chunk"}
    for r in rows:
        assert all(t > 0 for t in (*r["train_s"].values(), *r["decode_s"].values()))
        assert all(isinstance(b, int) and b >= 0 for b in r["peak_bytes"].values())
        assert set(r["decode_s"]) == {"recurrent step", "softmax step over the KV cache"}
    text = linear_forms.table(TINY, rows)
    assert text.count("\n| ") == 3 and "| 40 |" in text and "skipped" in text


def test_tiny_run_measures_both_forms_and_skips_the_parallel_one_past_the_limit(monkeypatch):
    monkeypatch.setattr(linear_forms, "_peak_bytes", _in_process)
    _check(linear_forms.run(TINY, log=lambda line: None))


@pytest.mark.slow
def test_tiny_run_with_a_child_process_per_peak():
    _check(linear_forms.run(TINY, log=lambda line: None))


def test_every_function_builds_its_inputs():
    for name in linear_forms.FUNCTIONS:
        config = linear_forms.Config(lengths=(9,), function=name, heads=2, head_dim=4, chunk_size=4)
        linear_forms._training_step(config, 9, "chunk")()
        for step in linear_forms._decode_steps(config, 9).values():
            step()


def test_the_script_writes_its_section_and_keeps_the_others(tmp_path, monkeypatch):
    monkeypatch.setattr(linear_forms, "_peak_bytes", _in_process)
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\n## Other\n\n<!-- other:start -->\nkept\n<!-- other:end -->\n")
    argv = ["--lengths", "16", "--heads", "2", "--head-dim", "8", "--chunk-size", "8", "--repeats", "1",
            "--budget", "0.5", "--function", "kimi_delta_attention", "--write", str(doc)]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        rows = linear_forms.main(argv)
    text = doc.read_text()
    assert "<!-- other:start -->\nkept\n<!-- other:end -->" in text
    head = f"## {linear_forms.TITLE}\n\n<!-- {linear_forms.NAME}:start -->\nCommand: `python benchmarks/linear_forms.py"
    assert head in text and "kimi_delta_attention: B = 1, H = 2, Dk = Dv = 8" in text
    assert text.count("| 16 |") == 1 and len(rows) == 1 and text.rstrip().endswith(f"<!-- {linear_forms.NAME}:end -->")
