"""HAN documents: exactly one sentence carries a complete class pattern, and it is the labelled one."""

import torch

from attnkit.lab import tasks


def _batch(n=100, seed=0, **sizes):
    task = tasks.get("han_documents", **sizes)
    return task, task.sample(n, generator=torch.Generator().manual_seed(seed))


def test_exactly_the_deciding_sentence_holds_the_label_pattern():
    _, batch = _batch(num_classes=3, num_sentences=5, max_words=7, min_words=3, num_neutral=20)
    signal = 1 + 20
    for doc, deciding, label in zip(batch["inputs"].tolist(), batch["deciding_sentence"].tolist(),
                                    batch["targets"].tolist(), strict=True):
        complete = []
        for j, sentence in enumerate(doc):
            words = set(sentence)
            full = [c for c in range(3) if {signal + 2 * c, signal + 2 * c + 1} <= words]
            complete += [(j, c) for c in full]
            signals = sorted(w for w in sentence if w >= signal)
            if j == deciding:
                assert signals == [signal + 2 * label, signal + 2 * label + 1]
            else:
                assert len(signals) <= 1  # a distractor is one lone signal word
        assert complete == [(deciding, label)]


def test_word_mask_lengths_and_padding_agree():
    _, batch = _batch(num_sentences=4, max_words=6, min_words=2)
    x, mask, lengths = batch["inputs"], batch["word_mask"], batch["word_lengths"]
    assert x.shape == mask.shape == (100, 4, 6) and lengths.shape == (100, 4) and mask.dtype == torch.bool
    assert torch.equal(mask.sum(-1), lengths)
    assert (x[~mask] == 0).all() and (x[mask] > 0).all()
    assert lengths.min() == 2 and lengths.max() == 6
    assert torch.equal(mask, torch.arange(6) < lengths.unsqueeze(-1))  # words first, padding after


def test_a_bag_of_words_is_sometimes_ambiguous_and_labels_and_positions_vary():
    task, batch = _batch(n=300)
    signal = 1 + task.num_neutral
    ambiguous = 0
    for doc, label in zip(batch["inputs"].tolist(), batch["targets"].tolist(), strict=True):
        words = {w for sentence in doc for w in sentence}
        other = 1 - label
        ambiguous += {signal + 2 * other, signal + 2 * other + 1} <= words
    assert ambiguous > 10  # documents where both halves of the wrong pattern appear (apart)
    assert set(batch["deciding_sentence"].tolist()) == set(range(6))
    assert set(batch["targets"].tolist()) == {0, 1}


def test_no_distractors_when_probability_is_zero():
    task, batch = _batch(distractor_prob=0.0)
    assert int((batch["inputs"] > task.num_neutral).sum()) == 2 * 100
