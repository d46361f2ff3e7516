"""document_questions (src/attnkit/tasks/document_questions.py): the asked subject's segment holds the answer."""

import torch

from attnkit.lab import tasks


def test_the_answer_is_the_value_in_the_asked_subjects_segment():
    task = tasks.get("document_questions", num_segments=4, segment_len=5, num_subjects=6, num_values=5)
    n = 100
    batch = task.sample(n, torch.Generator().manual_seed(0))
    doc = batch["inputs"].view(n, 4, 5)
    subjects = doc[:, :, 0]
    assert bool(((subjects >= 1) & (subjects <= 6)).all())
    assert all(len(set(row)) == 4 for row in subjects.tolist())  # distinct subjects per document
    value0 = 1 + task.num_subjects
    is_value = (doc >= value0) & (doc < value0 + task.num_values)
    assert bool((is_value.sum(-1) == 1).all())  # one value per segment, never at the subject's place
    rows = torch.arange(n)
    asked = batch["answer_segment"]
    assert torch.equal(subjects[rows, asked], batch["question"][:, 0])
    answer = (doc[rows, asked] * is_value[rows, asked]).sum(-1) - value0
    assert torch.equal(answer, batch["targets"])
    assert torch.equal(batch["segment_ids"], torch.arange(4).repeat_interleave(5))
    assert bool((batch["question"][:, 1] == task.question_token).all())
