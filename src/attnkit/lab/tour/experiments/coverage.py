"""Pointer-generator summaries with and without coverage (See et al. 2017), and their repetition.

:func:`repeated_ngrams` is the paper's repetition measure (Fig. 4: the share of duplicated
n-grams in generated summaries); :class:`SummaryObjective` trains a
:class:`~attnkit.models.pointer_generator.PointerGenerator` on ``key_summaries`` (eq. 13: the
coverage loss weighted 1 with coverage, 0 for the baseline), decodes greedily, and reports
exact match and the repeated n-grams of the decoded summaries.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ....models.pointer_generator import PointerGenerator
from ...tasks.key_summaries import BOS, EOS
from .train import Objective, recorded

__all__ = ["repeated_ngrams", "until_eos", "greedy_summaries", "SummaryObjective"]


def repeated_ngrams(sequences: Sequence[Sequence[int]], n: int) -> float:
    """The share of n-grams that repeat an earlier n-gram of the same sequence, over all sequences.

    ``sum_s |{i : g_i(s) in {g_j(s), j < i}}| / sum_s |n-grams of s|`` with ``g_i(s) = s[i:i+n]``;
    0.0 when no sequence has ``n`` tokens. Example: ``[1, 2, 1, 2, 3]`` has bigrams 12, 21, 12, 23:
    one repeat in four, 0.25.
    """
    repeated = total = 0
    for seq in sequences:
        seen = set()
        for i in range(len(seq) - n + 1):
            gram = tuple(seq[i:i + n])
            repeated += gram in seen
            seen.add(gram)
            total += 1
    return repeated / total if total else 0.0


def until_eos(ids: torch.Tensor) -> list[list[int]]:
    """Each row of ``ids (B, T)`` as a list cut before its first EOS (the whole row when there is none)."""
    rows = []
    for row in ids.tolist():
        rows.append(row[:row.index(EOS)] if EOS in row else row)
    return rows


@torch.no_grad()
def greedy_summaries(model: PointerGenerator, batch, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy decoding for ``steps`` steps (each step re-runs the teacher-forced pass on the prefix so far):
    ids ``(B, steps)`` and the attention of the last pass ``(B, steps, S)``."""
    src, lengths = batch["inputs"], batch["source_lengths"]
    prefix = torch.full((len(src), 1), BOS)
    for _ in range(steps):
        out = model(src, prefix, src_lengths=lengths)
        prefix = torch.cat([prefix, out.log_probs[:, -1].argmax(-1, keepdim=True)], 1)
    return prefix[:, 1:], out.attention


class SummaryObjective(Objective):
    """Eq. 13 (``-log P(w*_t) + coverage_weight * covloss_t``); exact match of the greedy summary.

    ``extra``: ``repeated_unigrams`` and ``repeated_bigrams`` (:func:`repeated_ngrams` of the decoded
    summaries up to EOS; the references have none) and ``token_accuracy``.
    """

    def __init__(self, coverage_weight: float):
        self.coverage_weight = coverage_weight

    def loss(self, model, batch, task):
        out = model(batch["inputs"], batch["decoder_inputs"], src_lengths=batch["source_lengths"])
        return PointerGenerator.loss(out, batch["targets"], coverage_weight=self.coverage_weight)

    def score(self, model, batch, task):
        return task.accuracy(greedy_summaries(model, batch, task.target_len)[0], batch)

    def extra(self, model, batch, task):
        ids, _ = greedy_summaries(model, batch, task.target_len)
        summaries = until_eos(ids)
        return {"repeated_unigrams": repeated_ngrams(summaries, 1), "repeated_bigrams": repeated_ngrams(summaries, 2),
                "token_accuracy": (ids == batch["targets"]).double().mean().item()}

    def examples(self, model, batch, task, count: int = 2):
        out = []
        for i in range(min(count, len(batch["targets"]))):
            one = {k: v[i:i + 1] for k, v in batch.items()}
            ids, _ = greedy_summaries(model, one, task.target_len)
            fed = torch.cat([torch.full((1, 1), BOS), ids[:, :-1]], 1)
            with recorded(model) as rec:
                weights = model(one["inputs"], fed, src_lengths=one["source_lengths"]).attention  # (1, T, S)
            del rec
            names = [_word(int(t), task) for t in one["inputs"][0]]
            said = [_word(int(t), task) for t in ids[0]]
            right = torch.equal(ids[0], one["targets"][0])
            out.append({"title": f"summary {i}: {' '.join(said)} ({'right' if right else 'wrong'})",
                        "maps": {"attention": weights}, "q_tokens": said, "k_tokens": names})
        return out


def _word(i: int, task) -> str:
    if i == EOS:
        return "</s>"
    if 4 <= i < 4 + task.num_key_words:
        return f"k{i - 4}"
    return "f"
