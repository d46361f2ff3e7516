"""BigramBackcopy (Guo et al. 2024): the back-copy rule after triggers, the fixed successor table, the scoring."""

from __future__ import annotations

import itertools

import torch

from attnkit.lab import tasks
from attnkit.lab.tasks import IGNORE_INDEX


def test_bigram_backcopy_follows_its_rule():
    task = tasks.get("bigram_backcopy", vocab_size=11, triggers=2, length=13)
    batch = task.sample(50, torch.Generator().manual_seed(0))
    x, nxt, targets = batch["inputs"], batch["next"], batch["targets"]
    assert x.shape == (50, 13) and bool((x[:, 0] == 0).all()) and bool((x[:, 1:] > 0).all())
    assert torch.equal(nxt[:, :-1], x[:, 1:])  # next is the input shifted
    trig = task.is_trigger(x)
    assert bool(trig.any()) and not bool(trig[:, :2].any())  # BOS and the first token are never triggers
    rows, cols = trig.nonzero(as_tuple=True)
    assert torch.equal(nxt[rows, cols], x[rows, cols - 1])  # after a trigger: the token before it
    assert torch.equal(targets == IGNORE_INDEX, ~trig)
    again = task.sample(50, torch.Generator().manual_seed(0))
    assert torch.equal(again["inputs"], x)
    successors = {}
    for row in x.tolist():  # outside triggers, each token has at most 3 successors (the fixed table)
        for a, b in itertools.pairwise(row[1:]):
            if a < 9:
                successors.setdefault(a, set()).add(b)
    assert max(len(s) for s in successors.values()) <= 3
