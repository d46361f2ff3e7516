"""The uniform contract every task keeps: determinism, layout, ranges, metric, argument errors."""

import random

import pytest
import torch

from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.lab import tasks
from attnkit.lab.tasks import IGNORE_INDEX

NAMES = tasks.names()
EXPECTED = {"mqar", "selective_copy", "listops", "sorting", "convex_hull", "dates", "reversal", "han_documents",
            "event_logs", "shapes"}


def _sample(name, n=7, seed=0, **sizes):
    task = tasks.get(name, **sizes)
    return task, task.sample(n, generator=torch.Generator().manual_seed(seed))


def test_registry_lists_every_task():
    assert set(NAMES) >= EXPECTED
    assert sorted(NAMES) == NAMES
    for name in NAMES:
        assert tasks.get(name).name == name


def test_unknown_name_raises_argument_error_naming_it():
    with pytest.raises(ArgumentError, match="name must be one of"):
        tasks.get("no_such_task")


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_gives_bitwise_same_batch_and_ignores_global_rng(name):
    task = tasks.get(name)
    torch.manual_seed(1)
    random.seed(1)
    a = task.sample(7, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(2)
    random.seed(2)
    b = task.sample(7, generator=torch.Generator().manual_seed(3))
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("name", NAMES)
def test_different_seeds_give_different_batches(name):
    _, a = _sample(name, n=16, seed=0)
    _, b = _sample(name, n=16, seed=1)
    assert not torch.equal(a["inputs"], b["inputs"])


@pytest.mark.parametrize("name", NAMES)
def test_no_generator_uses_the_global_rng(name):
    task = tasks.get(name)
    torch.manual_seed(5)
    a = task.sample(4)
    torch.manual_seed(5)
    b = task.sample(4)
    assert torch.equal(a["inputs"], b["inputs"]) and torch.equal(a["targets"], b["targets"])


@pytest.mark.parametrize("name", NAMES)
def test_layout_dtypes_and_ranges(name):
    task, batch = _sample(name, n=9)
    x, y = batch["inputs"], batch["targets"]
    assert task.kind in ("tokens", "classify", "seq2seq", "pointer", "image")
    assert x.shape[0] == y.shape[0] == 9
    assert y.dtype == torch.long
    scored = y[y != IGNORE_INDEX]
    assert scored.numel() > 0 and scored.min() >= 0 and scored.max() < task.num_classes
    if task.kind in ("tokens", "classify", "seq2seq"):
        assert x.dtype == torch.long and x.min() >= 0 and x.max() < task.vocab_size
    if task.kind == "tokens":
        assert y.shape == x.shape
    if task.kind in ("classify", "image"):
        assert y.shape == (9,) and (y != IGNORE_INDEX).all()
    if task.kind == "pointer":
        assert x.dtype == torch.float32 and x.dim() == 3 and (x >= 0).all() and (x < 1).all()
        assert task.num_classes >= x.shape[1]
    if task.kind == "seq2seq":
        assert batch["decoder_inputs"].shape == y.shape and batch["decoder_inputs"].max() < task.vocab_size
    if task.kind == "image":
        assert x.dtype == torch.float32 and x.dim() == 4


@pytest.mark.parametrize("name", NAMES)
def test_accuracy_is_one_on_targets_and_below_one_on_a_perturbed_prediction(name):
    task, batch = _sample(name, n=6)
    y = batch["targets"]
    assert task.accuracy(y.clone(), batch) == 1.0
    wrong = y.clone()
    flat = wrong.view(-1)
    first = int((flat != IGNORE_INDEX).nonzero()[0])  # a scored position of the first example
    flat[first] = (flat[first] + 1) % task.num_classes
    got = task.accuracy(wrong, batch)
    if task.kind == "tokens":
        assert got == pytest.approx(1 - 1 / int((y != IGNORE_INDEX).sum()))
    else:  # one example of six is wrong (exact match per sequence for seq2seq and pointer)
        assert got == pytest.approx(5 / 6)


@pytest.mark.parametrize("name", ["mqar", "reversal", "convex_hull"])
def test_accuracy_ignores_unscored_positions(name):
    task, batch = _sample(name, n=5)
    y = batch["targets"]
    junk = torch.where(y == IGNORE_INDEX, torch.zeros_like(y), y)
    assert task.accuracy(junk, batch) == 1.0


@pytest.mark.parametrize("name", NAMES)
def test_describe_is_one_line_naming_the_task(name):
    line = tasks.get(name).describe()
    assert isinstance(line, str) and "\n" not in line and line.startswith(name)


def test_accuracy_rejects_logits_wrong_shape_and_bad_batch():
    task, batch = _sample("listops", n=5)
    with pytest.raises(ShapeError, match="prediction"):
        task.accuracy(torch.zeros(5, 10, dtype=torch.long), batch)
    with pytest.raises(DTypeError, match="prediction"):
        task.accuracy(torch.zeros(5), batch)
    with pytest.raises(ArgumentError, match="batch"):
        task.accuracy(torch.zeros(5, dtype=torch.long), {"inputs": batch["inputs"]})


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_sample_rejects_bad_n(bad):
    with pytest.raises(ArgumentError, match="n must be"):
        tasks.get("mqar").sample(bad)


def test_sample_rejects_a_non_generator():
    with pytest.raises(ArgumentError, match="generator"):
        tasks.get("sorting").sample(3, generator=0)


BAD_ARGS = [
    ("mqar", {"num_pairs": 0}, "num_pairs"),
    ("mqar", {"num_pairs": 4, "num_queries": 5}, "num_queries"),
    ("mqar", {"num_pairs": 9, "num_keys": 8}, "num_keys"),
    ("mqar", {"gap": -1}, "gap"),
    ("mqar", {"num_values": 1.5}, "num_values"),
    ("selective_copy", {"num_tokens": 5, "context_len": 4}, "context_len"),
    ("selective_copy", {"data_vocab": 0}, "data_vocab"),
    ("listops", {"max_depth": 1}, "max_depth"),
    ("listops", {"max_args": 1}, "max_args"),
    ("listops", {"min_len": 40, "max_len": 30}, "min_len"),
    ("listops", {"max_depth": 2, "max_args": 2, "min_len": 5}, "min_len"),
    ("listops", {"max_len": 3}, "max_len"),
    ("sorting", {"num_points": 0}, "num_points"),
    ("sorting", {"point_dim": 3}, "point_dim"),
    ("convex_hull", {"num_points": 2}, "num_points"),
    ("dates", {"min_year": 999}, "min_year"),
    ("dates", {"min_year": 1950, "max_year": 2050}, "max_year"),
    ("dates", {"min_year": 2000, "max_year": 1999}, "max_year"),
    ("reversal", {"min_len": 0}, "min_len"),
    ("reversal", {"min_len": 5, "max_len": 4}, "max_len"),
    ("reversal", {"num_letters": 27}, "num_letters"),
    ("han_documents", {"num_classes": 1}, "num_classes"),
    ("han_documents", {"min_words": 1}, "min_words"),
    ("han_documents", {"max_words": 3, "min_words": 4}, "max_words"),
    ("han_documents", {"distractor_prob": 1.5}, "distractor_prob"),
    ("event_logs", {"num_events": 2}, "num_events"),
    ("event_logs", {"branching": 12, "num_events": 12}, "branching"),
    ("event_logs", {"anomaly_rate": -0.1}, "anomaly_rate"),
    ("event_logs", {"max_events": 1}, "max_events"),
    ("shapes", {"size": 8, "max_size": 4}, "size"),
    ("shapes", {"min_size": 3, "max_size": 2}, "max_size"),
    ("shapes", {"noise": float("nan")}, "noise"),
]


@pytest.mark.parametrize(("name", "kwargs", "arg"), BAD_ARGS)
def test_bad_constructor_arguments_raise_argument_error_naming_the_argument(name, kwargs, arg):
    with pytest.raises(ArgumentError, match=rf"\b{arg} must"):
        tasks.get(name, **kwargs)


def test_tasks_are_frozen_and_compare_by_sizes():
    task = tasks.get("mqar", gap=3)
    assert task == tasks.get("mqar", gap=3) and task != tasks.get("mqar", gap=4)
    with pytest.raises(AttributeError):
        task.gap = 5


@pytest.mark.parametrize("name", [n for n in NAMES if tasks.get(n).kind == "tokens"])
def test_inputs_show_later_answers_exactly_when_the_task_needs_a_causal_model(name):
    """A next-token task shows ``targets[:, t]`` at ``inputs[:, t + 1]``: flagged, so that no bidirectional
    model is trained on it; every other token task keeps its answers out of the following inputs (beyond the
    agreement of random tokens: half of all pairs of random bits agree)."""
    task, batch = _sample(name, n=64)
    x, y = batch["inputs"], batch["targets"]
    shares = []
    for k in (1, 2, 3):
        scored = y[:, :-k] != IGNORE_INDEX
        shares.append((x[:, k:] == y[:, :-k])[scored].double().mean().item())
    if task.needs_causal_model:
        assert shares[0] == 1.0
    else:
        assert max(shares) < max(0.5, 1.5 / task.vocab_size), shares


def test_a_task_that_marks_no_questions_says_so():
    from attnkit.lab import tasks

    task = tasks.get("long_listops")
    assert task.question_positions(task.sample(2, torch.Generator().manual_seed(0))["inputs"]) is None
