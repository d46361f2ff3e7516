"""Sequence-to-sequence experiments (dates, reversal): an RNN encoder-decoder with a chosen alignment."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ....models.seq2seq import Seq2Seq
from ...tasks import IGNORE_INDEX
from ...tasks.seq2seq import BOS, EOS, PAD
from .train import Objective, recorded

__all__ = ["Seq2SeqObjective", "NoAttention", "seq2seq_model"]


class NoAttention(nn.Module):
    """The no-attention baseline: context 0, so the decoder sees the source only through its start state.

    Sutskever et al. 2014 (arXiv:1409.3215) / Cho et al. 2014: the whole source is squeezed into
    the encoder's final state; plugged into :class:`~attnkit.models.seq2seq.Seq2Seq` it leaves
    ``h~_t = tanh(W_c [0; h_t])``. Its weights are all 0 (it attends to nothing).
    """

    def __init__(self, query_dim: int, key_dim: int):
        super().__init__()
        self.key_dim = key_dim

    def forward(self, query: torch.Tensor, memory: torch.Tensor, *, mask=None):
        b, t, s = query.shape[0], query.shape[1], memory.shape[1]
        return query.new_zeros(b, t, memory.shape[-1]), query.new_zeros(b, t, s)


def seq2seq_model(task, attention, *, embed_dim: int = 32, hidden_dim: int = 64) -> Seq2Seq:
    """A bidirectional-GRU :class:`Seq2Seq` over the task's shared vocabulary."""
    return Seq2Seq(task.vocab_size, task.vocab_size, embed_dim=embed_dim, hidden_dim=hidden_dim, rnn="gru",
                   attention=attention)


def _labels(ids: torch.Tensor, task) -> list[str]:
    """One label per id: its character, or ``<pad>``, ``<s>``, ``</s>``."""
    chars = task.chars()
    return [{PAD: "<pad>", BOS: "<s>", EOS: "</s>"}.get(i) or chars[i - 3] for i in ids.tolist()]


def _greedy(model: Seq2Seq, batch, task) -> torch.Tensor:
    return model.greedy_decode(batch["inputs"], src_lengths=batch["source_lengths"], max_len=task.target_len,
                               bos=BOS, eos=EOS).ids  # (B, target_len)


class Seq2SeqObjective(Objective):
    """Teacher-forced cross-entropy; scored by exact match of the greedy decoding (the task's metric)."""

    def loss(self, model, batch, task):
        out = model(batch["inputs"], batch["decoder_inputs"], src_lengths=batch["source_lengths"])
        return F.cross_entropy(out.logits.transpose(1, 2), batch["targets"], ignore_index=IGNORE_INDEX)

    def score(self, model, batch, task):
        return task.accuracy(_greedy(model, batch, task), batch)

    def extra(self, model, batch, task):
        """``char_accuracy``: share of target characters (and EOS) the greedy decoding gets right."""
        ids, scored = _greedy(model, batch, task), batch["targets"] != IGNORE_INDEX
        return {"char_accuracy": ((ids == batch["targets"]) & scored).sum().item() / scored.sum().item()}

    def examples(self, model, batch, task, count: int = 3):
        """Alignments ``(1, T, S)`` of the first test examples: the decoder fed its own greedy output."""
        out = []
        for i in range(min(count, len(batch["targets"]))):
            one = {k: v[i:i + 1] for k, v in batch.items()}
            ids = _greedy(model, one, task)[0]
            n = int((ids == EOS).int().argmax()) + 1 if bool((ids == EOS).any()) else len(ids)
            fed = torch.cat([torch.tensor([BOS]), ids[:n - 1]])[None]  # (1, n): BOS then the output
            with recorded(model) as rec:
                model(one["inputs"], fed, src_lengths=one["source_lengths"])
            maps = rec.as_dict(0)
            if not maps:
                continue
            s = int(one["source_lengths"][0])
            w = next(iter(maps.values()))  # (1, T, S)
            source, output = task.decode(one["inputs"][0]), task.decode(ids)
            q_tokens, k_tokens = _labels(ids[:n], task), _labels(one["inputs"][0, :s], task)
            title = f"{source!r} -> {output!r} ({'right' if output == task.decode(one['targets'][0]) else 'wrong'})"
            out.append({"title": title, "maps": {"alignment": w[:, :n, :s]}, "q_tokens": q_tokens,
                        "k_tokens": k_tokens})
        return out
