"""Event logs: normal sessions follow the process; each anomaly is an event never emitted in its context."""

import pytest
import torch

from attnkit.errors import ArgumentError, ShapeError
from attnkit.lab import tasks
from attnkit.lab.tasks import IGNORE_INDEX


def _batch(task, n=400, seed=0):
    return task.sample(n, generator=torch.Generator().manual_seed(seed))


def _triples(task, events, length, skip=-1):
    """``(role, prev, next)`` event-type transitions of one session, leaving out the one into ``skip``."""
    return [task.context(events, p) for p in range(2, length) if p != skip]


def test_training_data_is_normal_and_every_transition_is_allowed():
    task = tasks.get("event_logs")
    batch = _batch(task)
    assert not batch["is_anomaly"].any() and (batch["anomaly_position"] == -1).all()
    first = 1 + task.num_users
    for events, length in zip(batch["events"], batch["lengths"].tolist(), strict=True):
        assert 1 <= events[0] <= task.num_users and events[1] == first  # user, then login
        assert (events[length:] == 0).all() and (events[:length] > 0).all()
        for role, prev, nxt in _triples(task, events, length):
            assert task.transitions[role, prev, nxt] > 0 and nxt != 0
        ended = int(events[length - 1]) - first == task.num_events - 1
        assert ended or length == 1 + task.max_events  # logout, or cut at max_events


def test_anomalies_are_events_the_normal_process_never_emits_in_that_context():
    task = tasks.get("event_logs")
    observed = set()  # transitions seen in normal data: an empirical check independent of the table
    for seed in range(3):
        normal = _batch(task, n=1000, seed=seed)
        for events, length in zip(normal["events"], normal["lengths"].tolist(), strict=True):
            observed.update(_triples(task, events, length))
    test = task.test_task()
    assert test.anomaly_rate == 0.5 and test.process_seed == task.process_seed
    batch = _batch(test)
    flags, positions = batch["is_anomaly"], batch["anomaly_position"]
    assert 0.35 < flags.double().mean() < 0.65
    assert torch.equal(flags, positions >= 0)
    for events, length, p in zip(batch["events"], batch["lengths"].tolist(), positions.tolist(), strict=True):
        if p < 0:
            assert set(_triples(task, events, length)) <= observed
            continue
        assert 2 <= p < length
        role, prev, event = task.context(events, p)
        assert task.transitions[role, prev, event] == 0 and (role, prev, event) not in observed
        for triple in _triples(task, events, length, skip=p):  # the rest of the session is normal
            assert task.transitions[triple] > 0


def test_role_changes_what_is_normal():
    task = tasks.get("event_logs", num_roles=2)
    assert not torch.equal(task.transitions[0], task.transitions[1])
    assert torch.allclose(task.transitions[:, :-1].sum(-1), torch.ones(2, task.num_events - 1))
    assert ((task.transitions > 0).sum(-1)[:, :-1] == task.branching).all()
    assert (task.transitions[:, :, 0] == 0).all()  # login only opens a session


def test_next_event_layout():
    task = tasks.get("event_logs")
    batch = _batch(task, n=20)
    events = batch["events"]
    assert torch.equal(batch["inputs"], events[:, :-1])
    assert torch.equal(batch["targets"], events[:, 1:].masked_fill(events[:, 1:] == 0, IGNORE_INDEX))


def test_process_seed_changes_the_process():
    assert not torch.equal(tasks.get("event_logs").transitions, tasks.get("event_logs", process_seed=1).transitions)


def test_detection_auc():
    task = tasks.get("event_logs").test_task()
    batch = _batch(task, n=50)
    truth = batch["is_anomaly"].double()
    assert task.detection_auc(truth, batch) == 1.0
    assert task.detection_auc(-truth, batch) == 0.0
    assert task.detection_auc(torch.zeros(50), batch) == 0.5
    with pytest.raises(ShapeError, match="scores"):
        task.detection_auc(torch.zeros(49), batch)
    with pytest.raises(ArgumentError, match="both"):
        task.detection_auc(torch.zeros(50), _batch(tasks.get("event_logs"), n=50))
