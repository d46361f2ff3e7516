"""MQAR and selective copying: layouts checked element by element, and no answer leaks."""

import torch

from attnkit.lab import tasks
from attnkit.lab.tasks import IGNORE_INDEX


def _batch(name, n=32, seed=0, **sizes):
    task = tasks.get(name, **sizes)
    return task, task.sample(n, generator=torch.Generator().manual_seed(seed))


def test_mqar_layout_pairs_then_gap_then_queries():
    task, batch = _batch("mqar", num_pairs=5, num_queries=3, num_keys=7, num_values=11, gap=2)
    x, y = batch["inputs"], batch["targets"]
    assert x.shape == (32, 2 * 5 + 2 + 3) == (32, task.seq_len)
    keys, values = x[:, 0:10:2], x[:, 1:10:2]
    assert ((keys >= 1) & (keys <= 7)).all()
    assert ((values >= 8) & (values <= 18)).all()
    assert (x[:, 10:12] == 0).all()
    for row in keys.tolist():
        assert len(set(row)) == 5  # distinct keys
    assert (y[:, :12] == IGNORE_INDEX).all() and (y[:, 12:] != IGNORE_INDEX).all()


def test_mqar_targets_are_the_values_bound_to_the_queried_keys():
    _, batch = _batch("mqar", num_pairs=6, num_queries=4, gap=1)
    for row, labels in zip(batch["inputs"].tolist(), batch["targets"].tolist(), strict=True):
        bound = {row[2 * i]: row[2 * i + 1] for i in range(6)}
        queries = row[13:]
        assert len(set(queries)) == 4 and set(queries) <= set(bound)
        assert labels[13:] == [bound[k] for k in queries]


def test_mqar_never_shows_a_value_after_the_pairs():
    # a bidirectional model must not find the answer next to (or anywhere after) a query
    task, batch = _batch("mqar", num_pairs=8, num_queries=8, gap=3)
    x, y = batch["inputs"], batch["targets"]
    after = x[:, 16:]
    assert (after <= task.num_keys).all()  # filler or keys only, no value id
    scored = (y != IGNORE_INDEX).nonzero(as_tuple=True)
    assert (x[scored] <= task.num_keys).all() and (x[scored] >= 1).all()  # the scored token is a key
    nxt = torch.cat([x[:, 1:], torch.zeros(32, 1, dtype=torch.long)], dim=1)
    assert (nxt[scored] != y[scored]).all()


def test_mqar_queries_cover_keys_in_varying_order():
    _, batch = _batch("mqar", n=200, num_pairs=4, num_queries=4)
    first_query = batch["inputs"][:, 8]
    first_key = batch["inputs"][:, 0]
    frac = (first_query == first_key).double().mean().item()
    assert 0.1 < frac < 0.5  # a random order, not the pair order (expected 1/4)


def test_selective_copy_targets_are_the_data_tokens_in_order():
    _, batch = _batch("selective_copy", num_tokens=3, context_len=9, data_vocab=5)
    x, y = batch["inputs"], batch["targets"]
    assert x.shape == (32, 12)
    assert (x[:, 9:] == 1).all()  # markers
    assert (y[:, :9] == IGNORE_INDEX).all()
    for row, labels in zip(x.tolist(), y.tolist(), strict=True):
        data = [t for t in row[:9] if t != 0]
        assert len(data) == 3 and all(2 <= t <= 6 for t in data)
        assert labels[9:] == data


def test_selective_copy_positions_vary():
    _, batch = _batch("selective_copy", n=64)
    occupied = (batch["inputs"][:, :16] != 0).double().mean(0)
    assert (occupied > 0).all()  # every context position holds data in some example
