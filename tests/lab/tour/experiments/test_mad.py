"""The MAD battery's experiments: every task with every mechanism, each model what its name says."""

import pytest
import torch

from attnkit.lab.tasks.mad import MAD_TASKS
from attnkit.lab.tour.experiments import _train, experiments, mad
from attnkit.lab.tour.experiments.train import Budget
from attnkit.nn import GatedDeltaNet, KimiDeltaAttention, Mamba2Mixer, RetNetRetention


def test_six_tasks_times_every_mechanism_are_experiments_outside_the_default_tour():
    from attnkit.lab.tour.experiments import default_set

    exps = experiments()
    assert len(mad.KEYS) == 6 * len(mad.MECHANISMS) >= 60 and all(k in exps for k in mad.KEYS)
    assert {exps[k].task for k in mad.KEYS} == set(MAD_TASKS)
    assert len(mad.MECHANISMS) >= 10 and not set(mad.KEYS) & set(default_set(False))


def test_every_mechanism_of_a_task_trains_on_that_tasks_budget():
    exps = experiments()
    for task in MAD_TASKS:
        budgets = {exps[f"{task}/{name}"].budget for name in mad.MECHANISMS}
        assert budgets == {mad.BUDGETS.get(task, mad.BUDGET)}, task
        assert {exps[f"{task}/{name}"].quick for name in mad.MECHANISMS} == {mad.QUICK}
    recall = mad.BUDGETS[mad.CLAIM["task"]]  # the claim's task: past softmax's jump (10000-20000 sequences)
    assert recall.steps * recall.batch_size >= 16000 > mad.BUDGET.steps * mad.BUDGET.batch_size


@pytest.mark.parametrize(("mechanism", "layers"), [
    ("retnet", [RetNetRetention, RetNetRetention]), ("kda", [KimiDeltaAttention, KimiDeltaAttention]),
    ("hybrid-gdn", [GatedDeltaNet, "SoftmaxSelfAttention"]), ("hybrid-mamba2", [Mamba2Mixer, "SoftmaxSelfAttention"])])
def test_the_model_holds_the_named_mixer_in_each_layer(mechanism, layers):
    model = mad._build("compression", mechanism).model
    for layer, kind in zip(model.body.layers, layers, strict=True):
        assert (type(layer.self_attn).__name__ == kind) if isinstance(kind, str) else isinstance(layer.self_attn, kind)


def test_every_mechanism_gives_logits_over_the_tasks_vocabulary():
    for name in mad.MECHANISMS:
        built = mad._build("memorization", name)
        with torch.no_grad():
            out = built.model(built.task.sample(2, torch.Generator().manual_seed(0))["inputs"])
        assert out.shape == (2, built.task.seq_len, built.task.vocab_size), name


def test_the_window_sees_only_its_last_tokens():
    model = mad._build("compression", "window").model.eval()
    x = torch.randint(1, 10, (1, 40))
    y = x.clone()
    y[0, 0] = 11  # more than two windows back from the last position (two layers)
    with torch.no_grad():
        assert torch.allclose(model(x)[0, -1], model(y)[0, -1], atol=1e-6)
        assert not torch.allclose(model(x)[0, 1], model(y)[0, 1], atol=1e-6)


def test_a_tiny_run_scores_a_mad_task():
    exp = experiments()["compression/softmax"]
    result = _train(exp.key, exp, Budget(steps=2, batch_size=8, eval_size=16, test_size=16), 0, None)
    assert 0.0 <= result.accuracy <= 1.0 and result.task == "compression" and len(result.curve) == 2
