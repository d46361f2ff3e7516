"""The MAD tasks: each layout checked against a plain reading of the sequence, and no answer leaks."""

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab import tasks
from attnkit.lab.tasks import IGNORE_INDEX
from attnkit.lab.tasks.mad import MAD_TASKS


def _batch(name, n=16, seed=0, **sizes):
    task = tasks.get(name, **sizes)
    return task, task.sample(n, generator=torch.Generator().manual_seed(seed))


def _pairs(row, half, vocab):
    """Split a recall row into (key string, value string) units, skipping pad and noise tokens."""
    units, key, value = [], [], []
    for t in row:
        if 1 <= t <= half:
            if value:
                units.append((tuple(key), tuple(value)))
                key, value = [], []
            key.append(t)
        elif half < t <= vocab:
            value.append(t)
    return units


@pytest.mark.parametrize("name", ["in_context_recall", "fuzzy_recall", "noisy_recall"])
def test_recall_targets_are_the_next_value_tokens_of_keys_seen_before(name):
    task, batch = _batch(name)
    half = task.vocab // 2
    for row, labels in zip(batch["inputs"].tolist(), batch["targets"].tolist(), strict=True):
        scored = [t for t, y in enumerate(labels) if y != IGNORE_INDEX]
        assert scored and all(labels[t] == row[t + 1] and half < row[t + 1] <= task.vocab for t in scored)
        units = _pairs(row, half, task.vocab)
        binding = {}
        for key, value in units[:-1]:  # the last unit may be cut by the end
            assert binding.setdefault(key, value) == value  # one value per key string in a sequence
        first = {}
        for i, (key, _) in enumerate(units):
            first.setdefault(key, i)
        assert any(first[k] < i for i, (k, _) in enumerate(units))  # keys repeat: something to recall


def test_in_context_recall_scores_exactly_the_values_of_repeated_keys():
    _, batch = _batch("in_context_recall", seq_len=40, vocab=8)
    for row, labels in zip(batch["inputs"].tolist(), batch["targets"].tolist(), strict=True):
        seen, expected = set(), []
        for t in range(0, 38, 2):
            expected.append(labels[t] == (row[t + 1] if row[t] in seen else IGNORE_INDEX))
            seen.add(row[t])
        assert all(expected)


def test_noisy_recall_has_noise_tokens_of_their_own_and_fuzzy_recall_long_keys():
    task, batch = _batch("noisy_recall", n=64)
    noise = batch["inputs"] > task.vocab
    assert 0.05 < noise.double().mean().item() < 0.3 and (batch["targets"][noise] == IGNORE_INDEX).all()
    assert batch["inputs"].max() < task.vocab_size
    fuzzy, fb = _batch("fuzzy_recall", n=8)
    lengths = {len(k) for row in fb["inputs"].tolist() for k, _ in _pairs(row, fuzzy.vocab // 2, fuzzy.vocab)}
    assert lengths == {1, 2, 3}


def test_memorization_uses_one_map_for_every_batch_and_seed():
    task = tasks.get("memorization")
    a = task.sample(256, torch.Generator().manual_seed(0))
    b = task.sample(256, torch.Generator().manual_seed(1))
    table = {}
    for batch in (a, b):
        for k, v in zip(batch["inputs"][:, ::2].flatten().tolist(), batch["targets"][:, ::2].flatten().tolist(),
                        strict=True):
            assert table.setdefault(k, v) == v
    assert (a["inputs"][:, 1::2] == task.vocab_size - 1).all() and (a["targets"][:, 1::2] == IGNORE_INDEX).all()
    assert torch.equal(task.value_map(), tasks.get("memorization", map_seed=0).value_map())
    assert not torch.equal(task.value_map(), tasks.get("memorization", map_seed=1).value_map())


def test_compression_asks_each_position_once_for_the_token_that_stood_there():
    _, batch = _batch("compression", length=10, vocab=5)
    x, y = batch["inputs"], batch["targets"]
    assert x.shape == (16, 21) and (x[:, 10] == 6).all() and (y[:, :11] == IGNORE_INDEX).all()
    for row, labels in zip(x.tolist(), y.tolist(), strict=True):
        asked = [p - 7 for p in row[11:]]
        assert sorted(asked) == list(range(10))
        assert labels[11:] == [row[i] for i in asked]


def test_the_suite_lists_six_tasks_at_the_papers_easiest_sizes():
    assert MAD_TASKS == ("in_context_recall", "fuzzy_recall", "noisy_recall", "mad_selective_copy", "compression",
                         "memorization")
    copy = tasks.get("mad_selective_copy")
    assert (copy.seq_len, copy.num_tokens, copy.data_vocab) == (256, 16, 16)
    assert tasks.get("in_context_recall").seq_len == 128 and tasks.get("in_context_recall").vocab == 16


@pytest.mark.parametrize(("name", "sizes", "field"), [
    ("in_context_recall", {"vocab": 2}, "vocab"), ("noisy_recall", {"num_noise": 0}, "num_noise"),
    ("noisy_recall", {"noise": 1.0}, "noise"), ("memorization", {"seq_len": 7}, "seq_len"),
    ("compression", {"length": 0}, "length")])
def test_bad_sizes_are_named(name, sizes, field):
    with pytest.raises(ArgumentError, match=field):
        tasks.get(name, **sizes)
