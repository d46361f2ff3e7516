"""deciding_position (src/attnkit/tasks/deciding_position.py): one marked token, whose value is the label."""

import torch

from attnkit.lab import tasks


def test_exactly_one_marked_token_and_it_is_the_label():
    task = tasks.get("deciding_position", length=9, num_values=5)
    batch = task.sample(200, torch.Generator().manual_seed(0))
    marked = batch["inputs"] > task.num_values
    assert bool((marked.sum(1) == 1).all())
    assert torch.equal(marked.int().argmax(1), batch["deciding_position"])
    rows = torch.arange(200)
    assert torch.equal(batch["inputs"][rows, batch["deciding_position"]] - 1 - task.num_values, batch["targets"])
    assert int(batch["inputs"].min()) >= 1 and int(batch["inputs"].max()) < task.vocab_size
    # the unmarked tokens carry no information: their values are spread over all classes
    assert len(set(batch["deciding_position"].tolist())) == 9 and len(set(batch["targets"].tolist())) == 5
