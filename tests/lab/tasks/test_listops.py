"""ListOps: the evaluator on hand-written expressions, and generated labels against it."""

import statistics

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.lab import tasks
from attnkit.lab.tasks.listops import OPERATORS, TOKENS, evaluate


@pytest.mark.parametrize(("text", "value"), [
    ("7", 7),
    ("[MIN 3 1 4 ]", 1),
    ("[MAX 3 1 4 ]", 4),
    ("[SM 9 8 7 ]", 4),  # 24 mod 10
    ("[MED 3 9 1 ]", 3),
    ("[MED 1 4 ]", 2),  # LRA: int(np.median([1, 4])) = int(2.5) = 2
    ("[MED 2 8 5 9 ]", 6),  # middle pair 5, 8 -> int(6.5) = 6
    ("[MED 4 4 ]", 4),
    ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
    ("[SM [MAX 3 5 ] [MIN 8 6 ] 1 ]", 2),  # 5 + 6 + 1 = 12
    ("[MIN [MAX 1 [SM 5 6 ] ] [MED 9 7 8 ] ]", 1),  # MAX(1, 1) = 1, MED = 8
])
def test_evaluate_hand_cases(text, value):
    assert evaluate(text) == value
    assert evaluate(text.split()) == value


@pytest.mark.parametrize("text", ["", "[MIN ]", "[MIN 1 2", "1 2", "[MIN 1 2 ] 3", "[FOO 1 ]", "]", "[MAX 12 ]"])
def test_evaluate_rejects_malformed(text):
    with pytest.raises(ArgumentError, match="expression"):
        evaluate(text)


def _reference(tokens):
    """Recursive descent, written separately from the stack evaluator."""
    def node(i):
        tok = tokens[i]
        if tok not in OPERATORS:
            return int(tok), i + 1
        args, i = [], i + 1
        while tokens[i] != "]":
            v, i = node(i)
            args.append(v)
        fn = {"[MIN": min, "[MAX": max, "[SM": lambda a: sum(a) % 10,
              "[MED": lambda a: int(statistics.median(a))}[tok]
        return fn(args), i + 1
    value, end = node(0)
    assert end == len(tokens)
    return value


def test_generated_labels_agree_with_both_evaluators_and_lengths_are_bounded():
    task = tasks.get("listops", max_depth=4, max_args=4, min_len=7, max_len=25)
    batch = task.sample(300, generator=torch.Generator().manual_seed(0))
    x, lengths = batch["inputs"], batch["lengths"]
    assert x.shape == (300, 25)
    for row, n, label in zip(x.tolist(), lengths.tolist(), batch["targets"].tolist(), strict=True):
        assert 7 <= n <= 25 and all(t != 0 for t in row[:n]) and all(t == 0 for t in row[n:])
        tokens = [TOKENS[t] for t in row[:n]]
        assert evaluate(tokens) == _reference(tokens) == label


def test_depth_and_arguments_are_bounded():
    task = tasks.get("listops", max_depth=3, max_args=3, min_len=4, max_len=40)
    batch = task.sample(200, generator=torch.Generator().manual_seed(1))
    for row in batch["inputs"].tolist():
        depth = deepest = 0
        counts = []
        for t in (TOKENS[i] for i in row if i):
            if t in OPERATORS:
                depth += 1
                deepest = max(deepest, depth)
                counts.append(0)
            elif t == "]":
                depth -= 1
                assert 2 <= counts.pop() <= 3
            if t != "]" and len(counts) > (t in OPERATORS):
                counts[-1 - (t in OPERATORS)] += 1
        assert 1 <= deepest <= 2  # operators only at depths 1 .. max_depth - 1


def test_labels_use_all_ten_values():
    batch = tasks.get("listops").sample(500, generator=torch.Generator().manual_seed(2))
    counts = torch.bincount(batch["targets"], minlength=10)
    assert (counts > 10).all()


def test_decode_round_trips_text():
    task = tasks.get("listops")
    batch = task.sample(3, generator=torch.Generator().manual_seed(0))
    text = task.decode(batch["inputs"][0])
    assert " ".join(text.split()) == text and evaluate(text) == batch["targets"][0].item()
