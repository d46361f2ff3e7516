"""key_summaries (src/attnkit/tasks/key_summaries.py): each key word once, in order of first mention."""

import torch

from attnkit.lab import tasks
from attnkit.lab.tasks.key_summaries import BOS, EOS


def test_summary_lists_each_key_once_in_order_of_first_mention():
    task = tasks.get("key_summaries", doc_len=12, num_keys=4, repeats=2)
    batch = task.sample(60, torch.Generator().manual_seed(0))
    for doc, target, dec in zip(batch["inputs"].tolist(), batch["targets"].tolist(), batch["decoder_inputs"].tolist(),
                                strict=True):
        keys = [t for t in doc if 4 <= t < 4 + task.num_key_words]
        assert len(keys) == 6 and len(set(keys)) == 4  # two keys mentioned twice
        assert target == [*dict.fromkeys(keys), EOS] and dec == [BOS, *target[:-1]]
    assert bool((batch["source_lengths"] == 12).all())
