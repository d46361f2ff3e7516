"""Ceiling checks for the long-range tasks: an exact solver reads everything; counts and windows do not suffice.

A long-range task is only a test of long range if (a) its label is a function of the whole input,
so a model that sees everything can reach accuracy 1.0, and (b) the cheap shortcuts do not decide
it: a classifier on the token counts of the input ("bag of tokens") and one on the counts of the
last ``window`` tokens stay near chance. Long Range Arena (Tay et al. 2021, arXiv:2011.04006) and
Pathfinder (Linsley et al. 2018, arXiv:1805.08315) make the same argument for their tasks.

- ``solve(task, batch)``: the exact solver of each task, written from the task's definition and
  reading only ``batch["inputs"]`` (it shares no code with the generator).
- ``bag_of_tokens_accuracy(task, window=None)``: held-out accuracy of multinomial logistic
  regression on token frequencies (of the whole input, or of its last ``window`` non-padding
  tokens), and the chance level (the share of the most common class among the held-out labels).
  For a task labelled per position (kind ``"tokens"``) each example is one labelled position:
  the frequencies of its sequence and which token stands there.

Shapes: ``inputs (n, L)`` token ids (0 = padding), ``targets (n,)`` (or ``(n, L)`` with -100 where
nothing is scored); ``token_counts`` gives ``(n, V)``.

Example:
    >>> import torch
    >>> from attnkit.lab import tasks
    >>> from attnkit.lab.tasks.long_checks import solve
    >>> task = tasks.get("long_listops", length=64)
    >>> batch = task.sample(8, generator=torch.Generator().manual_seed(0))
    >>> task.accuracy(solve(task, batch), batch)
    1.0
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from ...errors import ArgumentError, check_int
from .base import IGNORE_INDEX
from .byte_docs import decode
from .listops import evaluate

__all__ = ["solve", "SOLVERS", "token_counts", "bag_of_tokens_accuracy"]


def _solve_long_listops(task, inputs: torch.Tensor) -> torch.Tensor:
    return torch.tensor([evaluate(task.decode(row)) for row in inputs])


def _solve_byte_text(task, inputs: torch.Tensor) -> torch.Tensor:
    answers = []
    for row in inputs:
        text = decode(row)
        key = re.search(r"\?([A-Z])", text).group(1)
        answers.append(int(re.search(key + r"=(\d)", text).group(1)))
    return torch.tensor(answers)


def _solve_byte_retrieval(task, inputs: torch.Tensor) -> torch.Tensor:
    answers = []
    for row in inputs.tolist():
        cut = row.index(task.vocab_size - 1)  # the separator, the highest id
        first, second = decode(row[:cut]), decode(row[cut + 1:])
        answers.append(int(set(re.findall("#(.)", first)) == set(re.findall("#(.)", second))))
    return torch.tensor(answers)


def _flood(on: set[tuple[int, int]], start: tuple[int, int], diagonal: bool) -> set[tuple[int, int]]:
    """The pixels of ``on`` joined to ``start`` through ``on`` (4- or 8-neighbours), by breadth-first search."""
    moves = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if (dy or dx) and (diagonal or not (dy and dx))]
    seen, frontier = {start}, [start]
    while frontier:
        y, x = frontier.pop()
        for dy, dx in moves:
            nxt = (y + dy, x + dx)
            if nxt in on and nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return seen


def _pixels(row: torch.Tensor, side: int, keep) -> set[tuple[int, int]]:
    return {(i // side, i % side) for i, v in enumerate(row.tolist()) if keep(v)}


def _solve_pixel_images(task, inputs: torch.Tensor) -> torch.Tensor:
    answers = []
    for row in inputs:
        bright = _pixels(row, task.side, lambda v: v > 128)  # ids are levels + 1; objects are brighter
        boxes = set()
        while bright:
            blob = _flood(bright, next(iter(bright)), diagonal=False)
            bright -= blob
            ys, xs = [p[0] for p in blob], [p[1] for p in blob]
            boxes.add((max(ys) - min(ys), max(xs) - min(xs), len(blob)))
        answers.append(len(boxes) - 1)
    return torch.tensor(answers)


def _solve_pathfinder(task, inputs: torch.Tensor) -> torch.Tensor:
    answers = []
    for row in inputs:
        drawn = _pixels(row, task.side, lambda v: v >= 2)  # curve 2, mark 3
        first, second = sorted(_pixels(row, task.side, lambda v: v == 3))
        answers.append(int(second in _flood(drawn, first, diagonal=True)))
    return torch.tensor(answers)


def _solve_associative_recall(task, inputs: torch.Tensor) -> torch.Tensor:
    first_fact = task.filler + 1 + task.num_keys  # filler, then keys, then facts (k, v)
    answers = torch.zeros_like(inputs)
    for row, out in zip(inputs.tolist(), answers, strict=True):
        value = {(i - first_fact) // task.num_values: (i - first_fact) % task.num_values
                 for i in row if i >= first_fact}
        for j, i in enumerate(row):
            if task.filler < i < first_fact:
                out[j] = value[i - task.filler - 1]
    return answers


def _solve_byte_context(task, inputs: torch.Tensor) -> torch.Tensor:
    answers = torch.zeros_like(inputs)
    for row, out in zip(inputs, answers, strict=True):
        text = decode(row)
        negated = text[0] == "~"
        for j, ch in enumerate(text):
            out[j] = int((ch == "+") != negated)
    return answers


def _solve_pixel_legend(task, inputs: torch.Tensor) -> torch.Tensor:
    first_colour, first_entry = 9, 9 + task.colours  # background levels 1..8, then colours, then legend entries
    answers = torch.zeros_like(inputs)
    for row, out in zip(inputs.tolist(), answers, strict=True):
        legend = {(i - first_entry) // task.classes: (i - first_entry) % task.classes
                  for i in row[:task.legend_rows * task.side]}
        for j, i in enumerate(row):
            if first_colour <= i < first_entry:
                out[j] = legend[i - first_colour]
    return answers


SOLVERS: dict[str, Callable[[object, torch.Tensor], torch.Tensor]] = {
    "long_listops": _solve_long_listops,
    "byte_text": _solve_byte_text,
    "byte_retrieval": _solve_byte_retrieval,
    "pixel_images": _solve_pixel_images,
    "pathfinder": _solve_pathfinder,
    "associative_recall": _solve_associative_recall,
    "byte_context": _solve_byte_context,
    "pixel_legend": _solve_pixel_legend,
}
"""Task name -> ``solver(task, inputs) -> predictions`` shaped like the task's targets."""


def solve(task, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Predictions (shaped like the targets) of the exact solver of ``task`` on ``batch["inputs"]`` (labels unread)."""
    if task.name not in SOLVERS:
        raise ArgumentError(f"long_checks.solve: task must be one of {sorted(SOLVERS)}; got {task.name!r}")
    return SOLVERS[task.name](task, batch["inputs"])


def token_counts(inputs: torch.Tensor, vocab_size: int, window: int | None = None) -> torch.Tensor:
    """Per-row counts ``(n, vocab_size)`` of the non-padding tokens, or of the last ``window`` of them."""
    kept = inputs != 0
    if window is not None:
        check_int("long_checks.token_counts", "window", window, 1)
        from_end = kept.flip(1).cumsum(1).flip(1)  # 1 at the last non-padding token, 2 before it, ...
        kept = kept & (from_end <= window)
    counts = torch.zeros(inputs.shape[0], vocab_size, dtype=torch.float64)
    return counts.scatter_add_(1, inputs, kept.double())


def _examples(task, batch: dict[str, torch.Tensor], counts: torch.Tensor, positions: int, generator):
    """``(features, targets)``: one example per sequence, or up to ``positions`` labelled positions of each."""
    if batch["targets"].dim() == 1:
        return counts, batch["targets"]
    scored = batch["targets"] != IGNORE_INDEX  # (n, L)
    pick = torch.rand(scored.shape, generator=generator).masked_fill(~scored, -1.0)
    order = pick.argsort(1, descending=True)[:, :positions]  # random labelled positions first
    keep = scored.gather(1, order)  # (n, positions)
    rows = torch.arange(len(counts)).view(-1, 1).expand_as(order)[keep]
    cols = order[keep]
    own = torch.nn.functional.one_hot(batch["inputs"][rows, cols], task.vocab_size).double()
    return torch.cat([counts[rows], own], 1), batch["targets"][rows, cols]


def bag_of_tokens_accuracy(task, *, window: int | None = None, train: int = 2000, test: int = 1000,
                           steps: int = 300, seed: int = 0, positions: int = 4) -> tuple[float, float]:
    """``(held-out accuracy, chance)`` of logistic regression on the token frequencies of ``task``'s inputs.

    Features: counts (``token_counts``) divided by the number of counted tokens, standardised with
    the training set's mean and spread; a linear layer to ``num_classes`` trained by Adam (full batch,
    ``steps`` steps, lr 0.05) on ``train`` fresh examples, scored on ``test`` others. ``chance`` is
    the share of the most common class among the held-out labels. A task labelled per position
    gives ``positions`` labelled positions of each sequence as examples, each with the frequencies
    of its sequence and a one-hot of its own token (the model can tell what it labels, not where
    the answer is): ``train`` and ``test`` then count sequences.
    """
    check_int("long_checks.bag_of_tokens_accuracy", "train", train, 1)
    check_int("long_checks.bag_of_tokens_accuracy", "test", test, 1)
    check_int("long_checks.bag_of_tokens_accuracy", "steps", steps, 1)
    check_int("long_checks.bag_of_tokens_accuracy", "positions", positions, 1)
    generator = torch.Generator().manual_seed(seed)
    batch = task.sample(train + test, generator=generator)
    counts = token_counts(batch["inputs"], task.vocab_size, window)
    counts = counts / counts.sum(1, keepdim=True).clamp_min(1)
    split = {name: {k: v[part] for k, v in batch.items() if isinstance(v, torch.Tensor)}
             for name, part in (("train", slice(0, train)), ("test", slice(train, None)))}
    x_train, y_train = _examples(task, split["train"], counts[:train], positions, generator)
    x_test, y_test = _examples(task, split["test"], counts[train:], positions, generator)
    mean, spread = x_train.mean(0), x_train.std(0).clamp_min(1e-6)
    x_train, x_test = ((x_train - mean) / spread).float(), ((x_test - mean) / spread).float()
    torch.manual_seed(seed)
    layer = torch.nn.Linear(x_train.shape[1], task.num_classes)
    optimiser = torch.optim.Adam(layer.parameters(), lr=0.05)
    for _ in range(steps):
        optimiser.zero_grad()
        torch.nn.functional.cross_entropy(layer(x_train), y_train).backward()
        optimiser.step()
    with torch.no_grad():
        predictions = layer(x_test).argmax(1)
    accuracy = (predictions == y_test).double().mean().item()
    chance = torch.bincount(y_test, minlength=task.num_classes).max().item() / len(y_test)
    return accuracy, chance
