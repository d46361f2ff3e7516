"""The repetition measure and decoding helpers of the coverage experiment (src/attnkit/tour/experiments/coverage.py)."""

import pytest
import torch

from attnkit.lab import tasks
from attnkit.lab.tasks.key_summaries import EOS
from attnkit.lab.tour.experiments.coverage import SummaryObjective, greedy_summaries, repeated_ngrams, until_eos


def test_repeated_ngrams_by_hand():
    # bigrams of [1, 2, 1, 2, 3]: 12, 21, 12, 23 -> one repeat in four
    assert repeated_ngrams([[1, 2, 1, 2, 3]], 2) == 0.25
    # unigrams: 1, 2, 1, 2, 3 -> two repeats in five; with [4, 4] (one repeat in two): 3 / 7
    assert repeated_ngrams([[1, 2, 1, 2, 3]], 1) == pytest.approx(2 / 5)
    assert repeated_ngrams([[1, 2, 1, 2, 3], [4, 4]], 1) == pytest.approx(3 / 7)
    # repeats count within a sequence only: the same bigram in two sequences is not a repeat
    assert repeated_ngrams([[5, 6], [5, 6]], 2) == 0.0
    assert repeated_ngrams([[7, 7, 7]], 2) == 0.5  # 77, 77
    assert repeated_ngrams([[1], []], 2) == 0.0  # no bigram at all


def test_until_eos_cuts_before_the_first_eos():
    ids = torch.tensor([[5, 6, EOS, 5], [7, 7, 7, 7]])
    assert until_eos(ids) == [[5, 6], [7, 7, 7, 7]]


def test_greedy_summaries_of_a_perfect_model_are_the_reference():
    task = tasks.get("key_summaries")
    batch = task.sample(4, torch.Generator().manual_seed(0))

    class Oracle(torch.nn.Module):  # teacher-forced: puts all mass on the next reference token
        def forward(self, src, prefix, src_lengths=None):
            t = prefix.shape[1]
            logp = torch.full((len(src), t, task.vocab_size), -30.0)
            logp[torch.arange(len(src)), -1, batch["targets"][:, t - 1]] = 0.0
            return type("Out", (), {"log_probs": logp, "attention": torch.zeros(len(src), t, src.shape[1])})()

    ids, attention = greedy_summaries(Oracle(), batch, task.target_len)
    assert torch.equal(ids, batch["targets"]) and attention.shape == (4, task.target_len, task.doc_len)
    assert repeated_ngrams(until_eos(ids), 1) == 0.0  # the references never repeat a word
    assert task.accuracy(ids, batch) == 1.0


def test_baseline_objective_leaves_out_the_coverage_loss():
    from attnkit.models.pointer_generator import PointerGenerator

    task = tasks.get("key_summaries")
    batch = task.sample(8, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    model = PointerGenerator(task.vocab_size, embed_dim=8, hidden_dim=8, coverage=False)
    out = model(batch["inputs"], batch["decoder_inputs"], src_lengths=batch["source_lengths"])
    nll = -out.log_probs.gather(-1, batch["targets"][..., None]).mean()
    assert SummaryObjective(0.0).loss(model, batch, task).item() == pytest.approx(nll.item(), rel=1e-6)
    with_cov = SummaryObjective(1.0).loss(model, batch, task).item()
    assert with_cov == pytest.approx(nll.item() + out.coverage_loss.mean().item(), rel=1e-6)
