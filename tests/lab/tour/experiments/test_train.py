"""The tour's training loop and experiments API: learning, determinism, the Result record, the catalog."""

from __future__ import annotations

import importlib
import json
import math
import subprocess
import sys

import pytest
import torch

import attnkit.lab.tour as tour
from attnkit.errors import ArgumentError
from attnkit.lab import tasks
from attnkit.lab.tour.experiments import recurrences, variants
from attnkit.lab.tour.experiments.tokens import MQARObjective, implied_linear_maps, language_model
from attnkit.lab.tour.experiments.train import Budget, PeakMemory, Result, fit, on_device
from attnkit.nn.linear import LinearAttention, PerformerAttention

experiments_module = importlib.import_module("attnkit.lab.tour.experiments")

# experiment groups that train variants on a task of another name (mqar, word_problem_s3)
GROUPS = {variants.TASK, recurrences.RECALL_TASK, recurrences.STATE_TASK}

TINY_BUDGET = Budget(steps=30, batch_size=16, lr=1e-2, eval_size=32, test_size=64)


def tiny_build():
    task = tasks.get("mqar", num_pairs=2, num_keys=5, num_values=3, gap=1)
    model = language_model(task, layers=1, dim=16, heads=2)
    return experiments_module.Built(model, task, task, MQARObjective())


TINY = experiments_module.Experiment("mqar", "tiny", "a 1-layer model on 2 pairs", tiny_build, TINY_BUDGET,
                                     Budget(steps=10, batch_size=16, eval_size=32, test_size=64))


@pytest.fixture
def tiny(monkeypatch):
    """Replace the catalog by the one tiny experiment ``"mqar/tiny"``."""
    monkeypatch.setattr(experiments_module, "_registry", lambda: {"mqar/tiny": TINY})
    return "mqar/tiny"


def test_loss_decreases_on_a_tiny_problem():
    torch.manual_seed(0)
    model, task, _, objective = tiny_build()
    batch = task.sample(64, torch.Generator().manual_seed(1))
    before = objective.loss(model, batch, task).item()
    trained = fit(model, task, objective, Budget(steps=60, batch_size=32, lr=1e-2, eval_size=64),
                  generator=torch.Generator().manual_seed(0), eval_batch=batch, evals=3)
    after = objective.loss(model, batch, task).item()
    assert after < 0.7 * before  # ln(9) = 2.2 at random; the value prior alone gives ln(3) = 1.1
    assert [p[0] for p in trained.curve] == [20, 40, 60]
    assert trained.curve[-1][1] < trained.curve[0][1]
    assert trained.seconds > 0 and (trained.peak_bytes is None or trained.peak_bytes >= 0)


def test_batches_move_to_the_device_and_the_peak_is_what_the_work_added():
    batch = {"inputs": torch.ones(2, 3, dtype=torch.long), "name": "kept"}
    moved = on_device(batch, "meta")
    assert moved["inputs"].device.type == "meta" and moved["name"] == "kept" and batch["inputs"].device.type == "cpu"
    assert PeakMemory("cpu").bytes() is None  # not started
    # In a fresh process: after other tests this one may hold freed memory the block would reuse, which the peak
    # rightly does not count (the whole suite once measured 0 here).
    code = ("import torch\nfrom attnkit.lab.tour.experiments.train import PeakMemory\npeak = PeakMemory('cpu')\n"
            "peak.start()\nblock = torch.ones(16 * 2**20)\nprint(peak.bytes())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    grown = done.stdout.strip().splitlines()[-1]
    if grown != "None":  # Linux: the high-water mark grows with the 64 MiB written
        assert int(grown) >= 60 * 2**20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fit_trains_on_cuda_and_measures_cuda_memory():
    torch.manual_seed(0)
    model, task, _, objective = tiny_build()
    batch = task.sample(16, torch.Generator().manual_seed(1))
    trained = fit(model, task, objective, Budget(steps=3, batch_size=8, eval_size=16),
                  generator=torch.Generator().manual_seed(0), eval_batch=batch, evals=1, device="cuda")
    assert next(model.parameters()).is_cuda and trained.peak_bytes > 0


def test_run_is_deterministic_per_seed_and_leaves_the_global_state(tiny):
    state, threads = torch.get_rng_state(), torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        first, again, other = tour.run(tiny, 3), tour.run(tiny, 3), tour.run(tiny, 4)
        assert torch.get_num_threads() == 2  # one thread inside run, the caller's setting after
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(torch.get_rng_state(), state)
    assert first.curve == again.curve and first.accuracy == again.accuracy and first.extra == again.extra
    for a, b in zip(first.examples, again.examples, strict=True):
        assert a["maps"].keys() == b["maps"].keys()
        assert all(torch.equal(a["maps"][n], b["maps"][n]) for n in a["maps"])
    assert first.curve != other.curve


def test_run_result_fields_and_progress(tiny):
    labels = []
    result = tour.run(tiny, 0, progress=labels.append)
    assert len(labels) == TINY.steps == experiments_module.EVALS + 1 and labels[-1].startswith("test")
    assert (result.key, result.task, result.mechanism, result.seed) == ("mqar/tiny", "mqar", "tiny", 0)
    assert 0.0 <= result.accuracy <= 1.0
    assert result.parameters == sum(p.numel() for p in tiny_build().model.parameters())
    assert len(result.curve) == experiments_module.EVALS and result.curve[-1][0] == TINY_BUDGET.steps
    (example,) = result.examples
    n = tasks.get("mqar", num_pairs=2, num_keys=5, num_values=3, gap=1).seq_len
    assert list(example["maps"]) == ["layer 0"] and example["maps"]["layer 0"].shape == (2, n, n)
    assert len(example["q_tokens"]) == len(example["k_tokens"]) == n
    torch.testing.assert_close(example["maps"]["layer 0"].sum(-1), torch.ones(2, n))
    assert set(result.extra) == {"attention_on_bound_value"}
    assert len(tour.run(tiny, 0, quick=True).curve) == experiments_module.EVALS  # 10 quick steps, 10 points


def test_result_json_round_trip(tiny):
    result = tour.run(tiny, 1)
    text = json.dumps(result.to_json())
    back = Result.from_json(text)
    assert Result.from_json(json.loads(text)).to_json() == back.to_json() == json.loads(text)
    for name in ("key", "task", "mechanism", "seed", "accuracy", "train_seconds", "peak_bytes", "parameters",
                 "extra"):
        assert getattr(back, name) == getattr(result, name)
    assert back.curve == [tuple(p) for p in result.curve]
    for a, b in zip(result.examples, back.examples, strict=True):
        assert a["title"] == b["title"] and a["q_tokens"] == b["q_tokens"]
        assert all(torch.equal(a["maps"][n], b["maps"][n]) for n in a["maps"])
    with pytest.raises(ArgumentError, match="lacks"):
        Result.from_json({"key": "x"})


def test_run_rejects_unknown_keys_and_bad_seeds(tiny):
    with pytest.raises(ArgumentError, match="unknown experiment 'mqar/nope'"):
        tour.run("mqar/nope", 0)
    with pytest.raises(ArgumentError, match="seed"):
        tour.run(tiny, -1)


@pytest.mark.parametrize("bad", [{"steps": 0}, {"lr": 0.0}, {"warmup": 1.0}, {"clip": -1.0}])
def test_budget_rejects_bad_values(bad):
    with pytest.raises(ArgumentError):
        Budget(**{"steps": 10, **bad})


def test_catalog_keys_and_default_sets():
    exps = tour.experiments()
    assert all(key == f"{e.task}/{e.mechanism}" and (e.task in tasks.names() or e.task in GROUPS) and e.description
               for key, e in exps.items())
    default, quick = tour.default_set(False), tour.default_set(True)
    assert len(set(default)) == len(default) and set(quick) <= set(default) <= set(exps)
    assert {"mqar/softmax-2layer", "mqar/softmax-1layer", "mqar/linear", "mqar/sliding-window",
            "dates/additive", "han_documents/han", "shapes/vit", "sorting/pointer"} <= set(default)
    assert all(exps[k].quick.steps <= exps[k].budget.steps for k in exps)


UNNORMALISED = {"sigmoid", "sigmoid-log-n"}  # maps whose rows need not sum to at most 1


@pytest.mark.parametrize("key", list(tour.experiments()))
def test_every_experiment_builds_trains_a_step_and_shows_maps(key):
    exp = tour.experiments()[key]
    torch.manual_seed(0)
    model, task, test_task, objective = exp.build()
    batch = task.sample(8, torch.Generator().manual_seed(0))
    loss = objective.loss(model, batch, task)
    loss.backward()
    assert math.isfinite(loss.item()) and any(p.grad is not None for p in model.parameters())
    model.eval()
    test = test_task.sample(16, torch.Generator().manual_seed(1))
    assert 0.0 <= objective.score(model, test, test_task) <= 1.0
    with torch.no_grad():
        examples, extra = objective.examples(model, test, test_task), objective.extra(model, test, test_task)
    assert all(0.0 <= v <= 1.0 for v in extra.values())
    for ex in examples:
        assert ex["title"] and ex["maps"]
        for name, w in ex["maps"].items():
            q = ex["q_tokens"][name] if isinstance(ex["q_tokens"], dict) else ex["q_tokens"]
            k = ex["k_tokens"][name] if isinstance(ex["k_tokens"], dict) else ex["k_tokens"]
            assert w.dim() == 3 and w.shape[1:] == (len(q), len(k)), (name, w.shape, len(q), len(k))
            assert bool((w >= 0).all())
            if exp.mechanism not in UNNORMALISED:  # sigmoid weights are each in (0, 1), not a distribution
                assert bool((w.sum(-1) <= 1 + 1e-4).all())


@pytest.mark.parametrize("cls", [LinearAttention, PerformerAttention])
@pytest.mark.parametrize("causal", [False, True])
def test_implied_linear_maps_reproduce_the_layer(cls, causal):
    torch.manual_seed(0)
    layer = cls(12, 3, causal=causal).double()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    (weights,) = implied_linear_maps(layer, x).values()  # (2, 3, 5, 5)
    _, _, v = layer.project(x)
    torch.testing.assert_close(layer.merge_heads(weights.double() @ v), layer(x), atol=1e-5, rtol=1e-4)
    if causal:
        assert bool((weights.triu(1) == 0).all())


def test_run_trains_at_the_asked_factor_of_its_learning_rate_and_refuses_a_bad_one(tiny, monkeypatch):
    rates = []

    def stop_at_fit(model, task, objective, budget, **kw):
        rates.append(budget.lr)
        raise StopIteration  # the rate is what this test reads, not the training

    monkeypatch.setattr(experiments_module, "fit", stop_at_fit)
    for factor in (1.0, 1 / 3, 3.0):
        with pytest.raises(StopIteration):
            tour.run(tiny, 0, lr_scale=factor)
    assert rates == [TINY_BUDGET.lr, pytest.approx(TINY_BUDGET.lr / 3), pytest.approx(3 * TINY_BUDGET.lr)]
    for bad in (0, -1.0, "3"):
        with pytest.raises(ArgumentError, match="lr_scale must be a positive number"):
            tour.run(tiny, 0, lr_scale=bad)
