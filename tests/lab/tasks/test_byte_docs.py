"""Byte ids, word filler and shuffled multisets."""

import torch

from attnkit.lab.tasks.byte_docs import VOCAB_SIZE, decode, encode, letters, random_words, shuffled_multiset


def test_ids_are_bytes_plus_one_and_round_trip():
    assert encode("a ?") == [98, 33, 64] and decode([98, 0, 33, 64]) == "a ?" and VOCAB_SIZE == 257
    assert decode(letters(3)) == "abc"


def test_random_words_are_lowercase_with_single_spaces():
    x = random_words(20, 200, torch.Generator().manual_seed(0))
    text = "".join(decode(row) for row in x)
    assert x.shape == (20, 200) and set(text) <= set("abcdefghijklmnopqrstuvwxyz ") and "  " not in text
    assert 0.08 < text.count(" ") / len(text) < 0.2


def test_shuffled_multiset_keeps_each_rows_counts_and_changes_order():
    base = torch.arange(12).repeat(3, 1)
    out = shuffled_multiset(base, torch.Generator().manual_seed(0))
    assert (out.sort(1).values == base).all() and not torch.equal(out, base) and not torch.equal(out[0], out[1])
