"""repeated_block (src/attnkit/tasks/repeated_block.py): the next token is always ``period`` back."""

import torch

from attnkit.lab import tasks
from attnkit.lab.tasks import IGNORE_INDEX


def test_targets_repeat_the_token_period_back_and_the_first_block_is_not_scored():
    task = tasks.get("repeated_block", period=4, length=11, vocab=6)
    batch = task.sample(50, torch.Generator().manual_seed(0))
    x = torch.cat([batch["inputs"], batch["targets"][:, -1:]], 1)  # the whole sequence (the last target is x[-1])
    assert x.shape == (50, 11) and torch.equal(x[:, 4:], x[:, :-4])
    assert bool((batch["targets"][:, :3] == IGNORE_INDEX).all())  # targets x_1..x_3: still the first block
    assert torch.equal(batch["targets"][:, 3:], x[:, 4:])  # every later target is scored: it is x_{t + 1}
    assert int(batch["inputs"].min()) >= 1 and int(batch["inputs"].max()) < 6
