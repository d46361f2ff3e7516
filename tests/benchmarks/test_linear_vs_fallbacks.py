"""benchmarks/linear_vs_fallbacks.py: attnkit's chunk forms and transformers' CPU fallbacks compute the same function
in float64 on the benchmark's inputs, and the script's rows and sections at tiny sizes (nothing is timed)."""

import contextlib
import functools
import io

import pytest
import torch

pytest.importorskip("transformers")

from attnkit.functional import recurrences as linear
from benchmarks import linear_vs_fallbacks as bench


@pytest.mark.parametrize("family", sorted(bench.FALLBACKS))
@pytest.mark.parametrize("length", [64, 150])
def test_attnkit_equals_the_transformers_fallback_in_float64(family, length):
    assert bench.check(family, length=length) <= 1e-9  # one full block, and two with a padded third


@pytest.mark.parametrize("family", sorted(bench.FALLBACKS))
def test_the_check_runs_the_fallback_in_float64_and_restores_it(family):
    module = bench.fallback(family)[0]
    tensors = bench.inputs(family, 20, 1, 8, dtype=torch.float64)
    (_, theirs), _ = bench._calls(family, tensors, 64, state=True)
    assert theirs()[1].dtype == torch.float32  # as transformers ships it (the output is cast back to float64)
    with bench._float64(module):
        assert theirs()[1].dtype == torch.float64
    assert module.torch is torch and torch.ones(1, dtype=torch.float64).float().dtype == torch.float32


def test_the_check_catches_another_convention(monkeypatch):
    monkeypatch.setattr(linear, "gated_delta_rule", functools.partial(linear.gated_delta_rule, scale=1.0))
    with pytest.raises(AssertionError, match="differ"):
        bench.check("gated_delta_rule")


def test_tiny_comparison_rows():
    rows = bench.compare("kimi_delta_attention", 40, heads=2, dim=8, chunk=16, rounds=1)
    assert [(r["pass"], r["length"]) for r in rows] == [("fwd", 40), ("fwd+bwd", 40)]
    assert all(r["ours_s"] > 0 and r["theirs_s"] > 0 and r["lo"] <= r["ratio"] <= r["hi"] for r in rows)
    text = bench.fallback_table(rows, {"kimi_delta_attention": 1e-16}, 2, 8, 16)
    assert "| kimi_delta_attention | chunk_kimi_delta_attention | 40 | fwd+bwd |" in text


@pytest.mark.parametrize("name", bench.FAMILIES)
def test_every_family_runs_forward_and_backward(name):
    fn, args, kwargs = bench._family_inputs(name, 9, 2, 4, torch.Generator().manual_seed(0))
    leaves = [t.requires_grad_() for t in args if t.dim() > 1]
    out = fn(*args, **kwargs)[0]
    assert out.shape == (1, 2, 9, 4)
    out.sum().backward()
    assert all(t.grad is not None for t in leaves)


def _fake_ratios(monkeypatch, values):
    ratios = iter(values)

    def fake(fns, rounds):
        r = next(ratios)
        return {"ours_s": r, "theirs_s": 1.0, "ratio": r, "lo": r, "hi": r}
    monkeypatch.setattr(bench, "_ratios", fake)


def test_the_crossover_stops_at_the_first_win(monkeypatch):
    _fake_ratios(monkeypatch, [3.0, 1.5, 0.8])
    res = bench.crossover("RetNet", [8, 16, 32, 64], heads=1, dim=4, rounds=1, log=lambda line: None)
    assert res["wins_at"] == 32 and [r["length"] for r in res["rows"]] == [8, 16, 32] and res["chunk"] == 64
    text = bench.crossover_table([res], 1, 4, [8, 16, 32, 64])
    assert "| RetNet | 64 | 32 | 0.80x (0.80-0.80) | 8: 3.00x, 16: 1.50x |" in text
    _fake_ratios(monkeypatch, [3.0, 2.0])
    never = bench.crossover("RetNet", [8, 16], heads=1, dim=4, rounds=1, log=lambda line: None)
    assert never["wins_at"] is None
    assert "| RetNet | 64 | > 16 |  | 8: 3.00x, 16: 2.00x |" in bench.crossover_table([never], 1, 4, [8, 16])


def test_the_script_writes_both_sections_and_keeps_the_others(tmp_path):
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\n## Other\n\n<!-- other:start -->\nkept\n<!-- other:end -->\n")
    argv = ["--lengths", "24", "--heads", "1", "--head-dim", "4", "--chunk-size", "8", "--rounds", "1",
            "--cross-lengths", "8", "16", "--cross-dim", "4", "--families", "DeltaNet", "--write", str(doc)]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        done = bench.main(argv)
    text = doc.read_text()
    assert "<!-- other:start -->\nkept\n<!-- other:end -->" in text
    for name, title in ((bench.NAME, bench.TITLE), (bench.CROSS_NAME, bench.CROSS_TITLE)):
        assert f"## {title}\n\n<!-- {name}:start -->\nCommand: `python benchmarks/linear_vs_fallbacks.py" in text
    assert text.count("| gated_delta_rule | torch_chunk_gated_delta_rule | 24 |") == 2
    assert "| DeltaNet | 64 |" in text and len(done["fallbacks"]) == 4 and len(done["crossover"]) == 1
