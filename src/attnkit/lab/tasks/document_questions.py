"""Questions over a document of segments: which value does the asked subject carry?"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ...errors import check_int
from .base import Task, register

__all__ = ["DocumentQuestions"]


@register
@dataclass(frozen=True)
class DocumentQuestions(Task):
    """A document of segments, each binding a subject to a value; the question names a subject.

    For question-guided attention over a document (Lu et al. 2016, "Hierarchical
    Question-Image Co-Attention for Visual Question Answering", arXiv:1606.00061, with a
    document standing in for the image's regions) and for attention over whole segments.
    One example (3 segments of 4 tokens)::

        document:  [s4 f2 v1 f0] [s1 v6 f3 f3] [s0 f1 f1 v2]     question: [s1 ?]     answer: 6

    Each of ``num_segments`` segments holds a distinct subject (first token), one value and
    ``segment_len - 2`` filler tokens at random positions after it. The question is the
    subject of one uniform segment followed by the question token; the label is that
    segment's value. Every value in the document is a plausible answer: only the binding of
    subject and value inside a segment tells which. ``segment_ids`` numbers each token's
    segment; ``answer_segment`` is the asked one.

    Token ids: 0 unused, subjects ``1 .. num_subjects``, values next (``num_values``), fillers
    next (``num_fillers``), then the question token. Values are drawn with replacement.

    Shapes:
        ``inputs (n, num_segments * segment_len)`` the document, ``question (n, 2)``,
        ``targets (n,)``, ``segment_ids (num_segments * segment_len,)``, ``answer_segment (n,)``.

    Complexity: ``O(n num_segments segment_len)`` per batch.

    Args:
        num_segments: segments per document (<= num_subjects).
        segment_len: tokens per segment (>= 2).
        num_subjects, num_values, num_fillers: vocabulary sizes of each kind.

    Example:
        >>> import torch
        >>> from attnkit.lab import tasks
        >>> task = tasks.get("document_questions", num_segments=3, segment_len=4)
        >>> batch = task.sample(2, generator=torch.Generator().manual_seed(0))
        >>> doc = batch["inputs"].view(2, 3, 4)
        >>> rows = torch.arange(2)
        >>> bool((doc[rows, batch["answer_segment"], 0] == batch["question"][:, 0]).all())
        True
    """

    name: ClassVar[str] = "document_questions"
    kind: ClassVar[str] = "classify"

    num_segments: int = 6
    segment_len: int = 4
    num_subjects: int = 12
    num_values: int = 8
    num_fillers: int = 8

    def __post_init__(self):
        who = "DocumentQuestions"
        check_int(who, "num_subjects", self.num_subjects, 1)
        check_int(who, "num_segments", self.num_segments, 1)
        check_int(who, "num_subjects", self.num_subjects, self.num_segments, " (= num_segments)")
        check_int(who, "segment_len", self.segment_len, 2)
        check_int(who, "num_values", self.num_values, 2)
        check_int(who, "num_fillers", self.num_fillers, 1)

    @property
    def question_token(self) -> int:
        return 1 + self.num_subjects + self.num_values + self.num_fillers

    @property
    def vocab_size(self) -> int:
        return self.question_token + 1

    @property
    def num_classes(self) -> int:
        return self.num_values

    @property
    def seq_len(self) -> int:
        return self.num_segments * self.segment_len

    def _sample(self, n, generator):
        s, w = self.num_segments, self.segment_len
        subjects = 1 + torch.rand(n, self.num_subjects, generator=generator).argsort(-1)[:, :s]  # (n, S) distinct
        values = torch.randint(0, self.num_values, (n, s), generator=generator)
        filler0 = 1 + self.num_subjects + self.num_values
        doc = torch.randint(filler0, filler0 + self.num_fillers, (n, s, w), generator=generator)
        doc[:, :, 0] = subjects
        slot = torch.randint(1, w, (n, s), generator=generator)  # the value's position after the subject
        doc.scatter_(2, slot[..., None], (1 + self.num_subjects + values)[..., None])
        asked = torch.randint(0, s, (n,), generator=generator)
        rows = torch.arange(n)
        question = torch.stack([subjects[rows, asked], torch.full((n,), self.question_token)], dim=1)
        return {"inputs": doc.reshape(n, s * w), "question": question, "targets": values[rows, asked],
                "segment_ids": torch.arange(s).repeat_interleave(w), "answer_segment": asked}

    def describe(self) -> str:
        return (f"document_questions: {self.num_segments} segments of {self.segment_len} tokens binding a subject "
                f"to one of {self.num_values} values; the question names a subject (classify)")
