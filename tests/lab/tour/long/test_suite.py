"""The long suite's plans (src/attnkit/tour/long/suite.py): lengths, mechanisms, seeds, and the LRA scale's dry run."""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab.tour.long.model import build
from attnkit.lab.tour.long.roster import MECHANISMS
from attnkit.lab.tour.long.suite import CHOSEN_BLOCKS, CLAIMED, SCALES, TASKS, plan, sizes_of, suite_task

META_FORWARD = ("sparse-strided", "sparse-fixed", "longformer", "nsa", "moba")  # layouts read data: no meta forward


def test_the_default_scale_is_long_runs_every_mechanism_and_three_seeds():
    the_plan = plan()
    lengths = {s.task: s.make().length for s in the_plan.setups}
    assert min(lengths.values()) >= 512 and max(lengths.values()) >= 2048
    assert {m for _, m in the_plan.pairs} == set(MECHANISMS)
    assert all(s.seeds == (0, 1, 2) for s in the_plan.setups)
    for setup in the_plan.setups:
        if TASKS[setup.task].retrieval:
            assert set(CLAIMED) - set(CHOSEN_BLOCKS) <= set(setup.mechanisms)
        assert all(TASKS[setup.task].image or not MECHANISMS[m].images_only for m in setup.mechanisms)
        assert setup.budget.eval_size <= setup.budget.batch_size  # evaluations never outgrow training's memory


def test_the_quick_scale_runs_every_mechanism_once_on_toy_sizes():
    the_plan = plan("quick")
    assert sorted(m for _, m in the_plan.pairs if m != "softmax") == sorted(set(MECHANISMS) - {"softmax"})
    assert all(s.make().length <= 256 and s.budget.steps <= 8 for s in the_plan.setups)


@pytest.mark.parametrize("scale", SCALES)
def test_nsa_and_moba_train_on_the_associative_recall_alone(scale):
    assert set(CHOSEN_BLOCKS) == {"nsa", "moba"} and set(CHOSEN_BLOCKS) <= set(CLAIMED)
    assert {t for t, m in plan(scale).pairs if m in CHOSEN_BLOCKS} == {"associative_recall"}
    assert set(CLAIMED) <= set(plan(scale).setup("associative_recall").mechanisms)


def _recall_logits(setup, name, inputs):
    task = setup.make()
    torch.manual_seed(0)
    model = build(task.vocab_size, task.num_classes, sizes_of(setup, task), layers=setup.model.layers,
                  ff=setup.model.ff, name=name, per_position=True).eval()
    with torch.no_grad():
        return model(inputs)


@pytest.mark.parametrize("scale", ["default", "quick"])
def test_every_fact_of_the_recall_lies_beyond_the_sliding_windows_reach(scale):
    """Facts replaced by filler move no query's logits under the window, and do move them under dense softmax
    and NSA, whose compressed blocks see the whole past."""
    setup = plan(scale).setup("associative_recall")
    task = setup.make()
    batch = task.sample(1, torch.Generator().manual_seed(0))
    inputs, queries = batch["inputs"], batch["targets"][0] != -100
    facts = inputs > task.filler + task.num_keys
    assert facts.any() and queries.any()
    assert queries.nonzero().min() - facts[0].nonzero().max() >= task.length // 4
    erased = inputs.masked_fill(facts, 1)
    for name in ("sliding-window", "softmax", "nsa"):
        before, after = (_recall_logits(setup, name, x)[0, queries] for x in (inputs, erased))
        reached = not torch.allclose(before, after, rtol=0, atol=1e-6)
        assert reached == (name != "sliding-window"), (name, (before - after).abs().max())
    if scale == "default":
        assert task.length >= 2048


def test_the_lra_scale_has_long_range_arenas_lengths_model_sizes_and_steps():
    setups = {s.task: s for s in plan("lra").setups}  # Tay et al. 2020, lra_benchmarks/*/configs
    lra = {"long_listops": (2000, 512, 8, 6, 2048, 32, 5000), "byte_text": (4000, 256, 4, 4, 1024, 32, 20000),
           "byte_retrieval": (4000, 128, 4, 4, 512, 32, 5000), "pixel_images": (1024, 32, 1, 1, 64, 256, 35000),
           "pathfinder": (1024, 32, 2, 1, 32, 512, 62400)}
    for task, (length, dim, heads, layers, mlp, batch, steps) in lra.items():
        s = setups[task]
        assert (s.make().length, s.model.dim, s.model.heads, s.model.layers, s.model.ff) == (length, dim, heads,
                                                                                            layers, mlp)
        assert (s.budget.batch_size, s.budget.steps) == (batch, steps)
    assert setups["associative_recall"].make().length == 4096 and set(setups["associative_recall"].mechanisms) \
        == set(CLAIMED)
    assert all(1000 <= s.make().length <= 4096 for s in setups.values())


def _logits_shape(setup, name, inputs, device) -> torch.Size:
    """``name``'s model at ``setup``'s full size, built on ``device``, applied to ``inputs`` there."""
    task = setup.make()
    with torch.device(device):
        model = build(task.vocab_size, task.num_classes, sizes_of(setup, task), layers=setup.model.layers,
                      ff=setup.model.ff, name=name, per_position=task.kind == "tokens")
    with torch.no_grad():
        return model(inputs.to(device)).shape


def _expected(item) -> tuple[int, ...]:
    return (1, item.length, item.num_classes) if item.kind == "tokens" else (1, item.num_classes)


def test_each_lra_task_draws_a_full_length_batch_that_dense_softmax_takes():
    """On the meta device: parameters have shapes and no memory, so a 6-block, 512-wide model costs nothing."""
    for setup in plan("lra").setups:
        item = setup.make()
        inputs = item.sample(1, torch.Generator().manual_seed(0))["inputs"]
        assert inputs.shape == (1, item.length) and inputs.max() < item.vocab_size
        assert tuple(_logits_shape(setup, "softmax", inputs, "meta")) == _expected(item), setup.task


@pytest.mark.slow
@pytest.mark.parametrize("task", [s.task for s in plan("lra").setups])
def test_every_lra_model_builds_at_full_size_and_takes_a_full_length_sequence(task):
    """Meta tensors where the mechanism never reads its data; a real sequence on the CPU where it does."""
    setup = plan("lra").setup(task)
    item = setup.make()
    inputs = item.sample(1, torch.Generator().manual_seed(0))["inputs"]
    for name in setup.mechanisms:
        device = "cpu" if name in META_FORWARD else "meta"
        assert tuple(_logits_shape(setup, name, inputs, device)) == _expected(item), name


def test_unknown_scales_and_tasks_are_named():
    assert set(SCALES) == {"default", "quick", "lra"}
    with pytest.raises(ArgumentError, match="unknown scale 'lr'; did you mean 'lra'"):
        plan("lr")
    with pytest.raises(ArgumentError, match="no task 'pathfinder'"):
        plan().setup("pathfinder")
    with pytest.raises(ArgumentError, match="unknown task 'nope'"):
        suite_task("nope")
