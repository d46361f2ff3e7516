"""What every long-range task keeps, checked once: seeds, layout, balance, the exact solver, the shortcuts."""

import torch

from attnkit.lab import tasks
from attnkit.lab.tasks import IGNORE_INDEX
from attnkit.lab.tasks.long_checks import bag_of_tokens_accuracy, solve


def sample(name, n=64, seed=0, **sizes):
    task = tasks.get(name, **sizes)
    return task, task.sample(n, generator=torch.Generator().manual_seed(seed))


def check_seeds(name, **sizes):
    """The same seed gives bitwise the same batch; another seed another batch."""
    _, a = sample(name, seed=3, **sizes)
    _, b = sample(name, seed=3, **sizes)
    _, c = sample(name, seed=4, **sizes)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["inputs"], c["inputs"])


def _labels(batch) -> torch.Tensor:
    """The scored labels of a batch: one per sequence, or those of the labelled positions."""
    y = batch["targets"]
    return y[y != IGNORE_INDEX]


def check_layout(name, n=32, **sizes):
    """``inputs (n, length)`` int64 ids in ``1 .. vocab_size - 1`` (no padding); ``targets`` int64 classes,
    ``(n,)``, or ``(n, length)`` with -100 where nothing is scored for a task labelled per position."""
    task, batch = sample(name, n=n, **sizes)
    x, y = batch["inputs"], batch["targets"]
    assert x.shape == (n, task.length) and x.dtype == torch.int64
    assert y.shape == ((n, task.length) if task.kind == "tokens" else (n,)) and y.dtype == torch.int64
    assert x.min() >= 1 and x.max() < task.vocab_size
    labels = _labels(batch)
    assert labels.numel() >= n and labels.min() >= 0 and labels.max() < task.num_classes
    return task, batch


def check_balance(name, n=400, tolerance=0.06, **sizes):
    """Every class holds ``1 / num_classes`` of a batch's labels, within ``tolerance``."""
    task, batch = sample(name, n=n, **sizes)
    labels = _labels(batch)
    share = torch.bincount(labels, minlength=task.num_classes).double() / labels.numel()
    assert ((share - 1 / task.num_classes).abs() <= tolerance).all(), share.tolist()


def check_solver(name, n=200, **sizes):
    """The exact solver, which reads only the inputs, gets every label."""
    task, batch = sample(name, n=n, seed=5, **sizes)
    assert task.accuracy(solve(task, batch), batch) == 1.0


def check_shortcuts(name, window=64, train=800, test=400, **sizes):
    """Token counts of the whole input, and of its last ``window`` tokens, stay within 0.1 of chance."""
    task = tasks.get(name, **sizes)
    for cut in (None, window):
        accuracy, chance = bag_of_tokens_accuracy(task, window=cut, train=train, test=test)
        assert accuracy <= chance + 0.1, (cut, accuracy, chance)
