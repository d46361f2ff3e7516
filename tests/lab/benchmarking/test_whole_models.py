"""The whole-model rows compare equal models: the same loss, logits and tokens from both sides (float64).

No timing is asserted: the rows run once at tiny sizes.
"""

from __future__ import annotations

import pytest
import torch

from attnkit.lab.benchmarking import whole_models as wm

TINY = wm.Sizes.parse("batch=2,length=16,window_length=24,window=5,width=32,heads=4,layers=2,vocab=37,prompt=5,"
                      "new_tokens=4,gen_batch=2")


@pytest.mark.parametrize("name", wm.ROWS)
def test_each_rows_two_sides_compute_the_same_thing(name):
    """Training rows: equal losses for two steps (so equal weights, gradients and AdamW updates); generation: tokens."""
    (row,) = wm.rows(TINY, (name,), dtype=torch.float64)
    for _ in range(2 if name != "generate" else 1):
        ours, theirs = row.ours(), row.theirs()
        if name == "generate":
            assert ours.shape == (TINY.gen_batch, TINY.prompt + TINY.new_tokens) and torch.equal(ours, theirs)
        else:
            assert ours.dtype == torch.float64 and ours.dim() == 0
            torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_the_window_comparison_would_see_a_different_window():
    """The equal-loss check is sensitive: SDPA's dense mask one key wider gives another loss."""
    ids = wm.tokens(TINY, 2, TINY.window_length + 1)
    losses = [wm.training_step(wm.plain_gpt(TINY, wm.sdpa_window(TINY.window_length, w), torch.float64), ids)()
              for w in (TINY.window, TINY.window + 1)]
    (row,) = wm.rows(TINY, ("window",), dtype=torch.float64)
    torch.testing.assert_close(row.ours(), losses[0], rtol=1e-12, atol=1e-12)
    assert abs(float(losses[0] - losses[1])) > 1e-6


def test_sdpa_window_mask_is_the_causal_band():
    q = k = v = torch.eye(6, dtype=torch.float64)[None, None].expand(1, 1, 6, 6)  # out[i] = weights row i
    weights = wm.sdpa_window(6, 3)(q, k, v)[0, 0]
    i, j = torch.meshgrid(torch.arange(6), torch.arange(6), indexing="ij")
    assert torch.equal(weights > 0, (j <= i) & (j > i - 3))


def test_sizes_parse_overrides_and_refuses_unknown_or_bad_values():
    assert wm.Sizes.parse("length=64, width=32") == wm.Sizes(length=64, width=32)
    assert wm.Sizes.parse("") == wm.Sizes()
    for bad in ("lenght=64", "length=0", "length=x", "length"):
        with pytest.raises(ValueError, match="names: batch, length"):
            wm.Sizes.parse(bad)


def test_parse_rows_keeps_table_order_and_refuses_unknown_names():
    assert wm.parse_rows("all") == wm.ROWS
    assert wm.parse_rows("generate,causal") == ("causal", "generate")
    with pytest.raises(ValueError, match="unknown row 'casual'"):
        wm.parse_rows("casual,lm")


def test_run_reports_every_row():
    results = wm.run(TINY, ("causal", "generate"), rounds=2)
    assert [r["goal"] for r in results] == [wm.GOALS["causal"], wm.GOALS["generate"]]
    assert all(r["lo"] <= r["ratio"] <= r["hi"] and r["ours_us"] > 0 for r in results)
    args = type("Args", (), {"rounds": 2, "rows": ("causal", "generate"), "sizes": TINY, "compiled": False})
    text = wm.report(args, results)
    assert "--rows causal,generate --sizes batch=2,length=16," in text and "| attnkit ms |" in text


@pytest.mark.slow
@pytest.mark.parametrize("name", wm.ROWS)
def test_compiled_rows_compute_what_the_eager_ones_do(name):
    (eager,) = wm.rows(TINY, (name,))
    (compiled,) = wm.rows(TINY, (name,), compiled=True)
    for a, b in ((compiled.ours(), eager.ours()), (compiled.theirs(), eager.theirs())):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_both_sides_of_the_compiled_generation_row_compile_to_one_graph_per_step_kind():
    """The compiled generation row compares whole compiled steps: the plain model's forward and
    ``TransformerLM.step`` each compile to two graphs (the prefill and every decoding step) with no graph break
    (``is_causal`` given a SymBool would break the plain model's into per-block frames run from eager Python).
    Counted by a backend that counts what dynamo hands it (no timing)."""
    from torch._dynamo.testing import CompileCounter
    from torch._dynamo.utils import counters

    prompt = wm.tokens(TINY, TINY.gen_batch, TINY.prompt)
    for model in (wm.transformer_lm(TINY).eval(), wm.plain_gpt(TINY).eval()):
        torch._dynamo.reset()
        counters.clear()
        backend = CompileCounter()
        name = "step" if hasattr(model, "step") else "forward"
        setattr(model, name, torch.compile(getattr(model, name), backend=backend, dynamic=True))
        try:
            model.generate(prompt, TINY.new_tokens)
            assert backend.frame_count == 2, type(model).__name__
            assert not counters["graph_break"], dict(counters["graph_break"])
        finally:
            torch._dynamo.reset()
