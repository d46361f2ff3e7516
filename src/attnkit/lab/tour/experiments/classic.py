"""Classic attention modules on tasks built for their papers' claims: hard, memory, segment and co-attention.

- :class:`OnePositionClassifier` (Xu et al. 2015): a learned query attends over the tokens of
  ``deciding_position`` with :class:`~attnkit.nn.hard.HardAttention`, soft or stochastic
  (REINFORCE, :class:`HardObjective`).
- :class:`MemoryLM` (Yogatama et al. 2018): an LSTM language model with or without
  :class:`~attnkit.nn.memory.MemoryAttention` over its last ``K`` states, on ``repeated_block``.
- :class:`QuestionModel` (Lu et al. 2016): a question over a ``document_questions`` document
  read through :class:`~attnkit.nn.segment.SegmentAttention`,
  :class:`~attnkit.nn.coattention.CoAttention` or no attention (the document's mean).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ....errors import ArgumentError
from ....nn.coattention import CoAttention
from ....nn.hard import HardAttention
from ....nn.memory import MemoryAttention
from ....nn.segment import SegmentAttention
from .tokens import TokenObjective
from .train import Objective

__all__ = ["OnePositionClassifier", "HardObjective", "MemoryLM", "MemoryObjective", "QuestionModel",
           "QuestionObjective", "QUESTION_READERS"]


class OnePositionClassifier(nn.Module):
    """Token embeddings, one learned query, :class:`HardAttention` over the positions, an MLP on the context.

    Xu et al. 2015 (arXiv:1502.03044), Sec. 4 with a single step: ``alpha = softmax(f_att(a_i, q))``;
    ``mode="soft"``: ``z = sum_i alpha_i a_i`` (Sec. 4.2); ``mode="stochastic"``: in training
    ``z = a_s, s ~ Multinoulli(alpha)`` (Sec. 4.1, trained by REINFORCE in :class:`HardObjective`),
    in eval the most likely location ``s = argmax alpha`` (deterministic).

    Shapes: inputs ``(B, n)`` -> logits ``(B, C)``, and the :class:`~attnkit.nn.hard.HardOutput` (one query).
    """

    def __init__(self, vocab_size: int, num_classes: int, *, dim: int = 32, mode: str = "soft"):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.query = nn.Parameter(torch.randn(1, 1, dim) * dim ** -0.5)
        self.attention = HardAttention(dim, dim, dim, mode=mode)
        self.out = nn.Sequential(nn.Linear(dim, dim), nn.Tanh(), nn.Linear(dim, num_classes))

    def forward(self, inputs: torch.Tensor):
        x = self.embed(inputs)  # (B, n, dim)
        out = self.attention(self.query.expand(len(x), 1, -1), x)
        context = out.context[:, 0]  # (B, dim)
        if self.attention.mode == "stochastic" and not self.training:
            context = x[torch.arange(len(x)), out.probs[:, 0].argmax(-1)]
        return self.out(context), out


class HardObjective(Objective):
    """Cross-entropy; for stochastic attention plus REINFORCE: ``-(R - mean R) log alpha_s`` with ``R = -CE``.

    Xu et al. 2015, eq. 12 with the batch mean as the baseline (no entropy term). ``extra``:
    ``attention_on_deciding_position``, the share of test sequences whose most likely location is
    the marked token.
    """

    def loss(self, model, batch, task):
        logits, out = model(batch["inputs"])
        ce = F.cross_entropy(logits, batch["targets"], reduction="none")  # (B,)
        if out.log_prob is None:
            return ce.mean()
        reward = -ce.detach()
        return ce.mean() - ((reward - reward.mean()) * out.log_prob[:, 0]).mean()

    def score(self, model, batch, task):
        return task.accuracy(model(batch["inputs"])[0].argmax(-1), batch)

    def extra(self, model, batch, task):
        probs = model(batch["inputs"])[1].probs[:, 0]  # (B, n)
        return {"attention_on_deciding_position": (probs.argmax(-1) == batch["deciding_position"]).double().mean()
                .item()}

    def examples(self, model, batch, task, count: int = 2):
        out = []
        for i in range(min(count, len(batch["targets"]))):
            logits, att = model(batch["inputs"][i:i + 1])
            ids = batch["inputs"][i].tolist()
            tokens = [f"*{t - 1 - task.num_values}" if t > task.num_values else str(t - 1) for t in ids]
            title = f"sequence {i}: label {int(batch['targets'][i])}, predicted {int(logits.argmax())}"
            out.append({"title": title, "maps": {"attention": att.probs[0][None]}, "q_tokens": ["query"],
                        "k_tokens": tokens})
        return out


class MemoryLM(nn.Module):
    """An LSTM language model, with or without a random access memory over its last ``memory_size`` states.

    Yogatama et al. 2018 (ICLR), Sec. 2: ``h_t = LSTM(x_t, h_{t-1})``; with memory
    ``m_t = sum_{i=t-K}^{t-1} a_i h_i`` (:class:`MemoryAttention`) and ``logits_t = W [h_t; m_t]``;
    without, ``logits_t = W h_t``. Shapes: inputs ``(B, n)`` -> logits ``(B, n, V)``.
    """

    def __init__(self, vocab_size: int, *, dim: int = 32, hidden_dim: int = 64, memory_size: int | None = None):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.lstm = nn.LSTM(dim, hidden_dim, batch_first=True)
        self.memory = None if memory_size is None else MemoryAttention(hidden_dim, memory_size)
        self.out = nn.Linear(hidden_dim * (1 + (memory_size is not None)), vocab_size)
        self.last_weights = None

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.embed(inputs))  # (B, n, H)
        if self.memory is None:
            return self.out(h)
        memory, self.last_weights = self.memory(h)  # (B, n, H), (B, n, K)
        return self.out(torch.cat([h, memory], -1))


class MemoryObjective(TokenObjective):
    """:class:`TokenObjective`; ``extra``: ``memory_on_needed_state``, the share of scored predictions whose
    top memory slot holds the state that read the needed token (``period - 1`` steps back; memory only)."""

    def examples(self, model, batch, task):
        return []

    def extra(self, model, batch, task):
        model(batch["inputs"])
        if model.memory is None or task.period - 1 > model.memory.memory_size:
            return {}
        scored = batch["targets"] != -100
        needed = model.memory.memory_size - (task.period - 1)  # slot j holds h_{t-K+j}
        top = model.last_weights.argmax(-1)  # (B, n)
        return {"memory_on_needed_state": (top[scored] == needed).double().mean().item()}


QUESTION_READERS = ("segment", "co-attention", "none")


class QuestionModel(nn.Module):
    """Answer a question over a document: a shared bidirectional-GRU document encoder and one reader.

    Readers: ``"segment"``: :class:`SegmentAttention` from the question (mean of its word
    embeddings) over the mean-pooled segments; ``"co-attention"``: :class:`CoAttention` (parallel,
    Lu et al. 2016, eqs. 3-5) between the question words and the document tokens, answering
    from ``[q_hat; v_hat]``; ``"none"``: the document's mean state beside the question's (no
    attention). An MLP maps ``[question; read]`` to the classes.

    Shapes: inputs ``(B, n)``, question ``(B, T)``, segment_ids ``(n,)`` -> logits ``(B, C)`` and the
    document token weights ``(B, n)`` (None for ``"none"``).
    """

    def __init__(self, vocab_size: int, num_classes: int, *, reader: str = "segment", dim: int = 32):
        super().__init__()
        if reader not in QUESTION_READERS:
            raise ArgumentError(f"QuestionModel: reader must be one of {QUESTION_READERS}; got {reader!r}")
        self.reader = reader
        self.embed = nn.Embedding(vocab_size, dim)
        self.encoder = nn.GRU(dim, dim // 2, batch_first=True, bidirectional=True)
        if reader == "segment":
            self.attention = SegmentAttention(dim)
        elif reader == "co-attention":
            self.attention = CoAttention(dim, dim, dim)
        self.out = nn.Sequential(nn.Linear(2 * dim, 2 * dim), nn.Tanh(), nn.Linear(2 * dim, num_classes))

    def forward(self, inputs, question, segment_ids):
        doc, _ = self.encoder(self.embed(inputs))  # (B, n, dim)
        words = self.embed(question)  # (B, T, dim)
        q = words.mean(1)
        if self.reader == "segment":
            out = self.attention(q[:, None], doc, segment_ids)
            return self.out(torch.cat([q, out.output[:, 0]], -1)), out.token_weights[:, 0]
        if self.reader == "co-attention":
            q_hat, v_hat, _, weights = self.attention(words, doc)
            return self.out(torch.cat([q_hat, v_hat], -1)), weights
        return self.out(torch.cat([q, doc.mean(1)], -1)), None


class QuestionObjective(Objective):
    """Cross-entropy on the answer; ``extra``: ``attention_on_answer_segment``, the share of questions whose
    most-weighted document token lies in the asked segment (readers with attention)."""

    @staticmethod
    def _out(model, batch):
        return model(batch["inputs"], batch["question"], batch["segment_ids"])

    def loss(self, model, batch, task):
        return F.cross_entropy(self._out(model, batch)[0], batch["targets"])

    def score(self, model, batch, task):
        return task.accuracy(self._out(model, batch)[0].argmax(-1), batch)

    def extra(self, model, batch, task):
        _, weights = self._out(model, batch)
        if weights is None:
            return {}
        segment = batch["segment_ids"][weights.argmax(-1)]  # (B,)
        return {"attention_on_answer_segment": (segment == batch["answer_segment"]).double().mean().item()}

    def examples(self, model, batch, task, count: int = 2):
        out = []
        for i in range(min(count, len(batch["targets"]))):
            one = {k: (v if k == "segment_ids" else v[i:i + 1]) for k, v in batch.items()}
            logits, weights = self._out(model, one)
            if weights is None:
                return []
            tokens = [_doc_token(int(t), task) for t in one["inputs"][0]]
            title = (f"question about {_doc_token(int(one['question'][0, 0]), task)}: answer "
                     f"{int(one['targets'][0])}, predicted {int(logits.argmax())}")
            out.append({"title": title, "maps": {"document attention": weights[0][None, None]},
                        "q_tokens": ["question"], "k_tokens": tokens})
        return out


def _doc_token(i: int, task) -> str:
    if i <= task.num_subjects:
        return f"s{i - 1}"
    if i <= task.num_subjects + task.num_values:
        return f"v{i - 1 - task.num_subjects}"
    return "f"
