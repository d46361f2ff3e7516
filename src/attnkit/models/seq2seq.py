"""RNN encoder-decoder with a pluggable attention module (Bahdanau et al. 2015; Luong et al. 2015)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import ArgumentError, check_int
from ..nn.additive import AdditiveAttention
from ..nn.coverage import CoverageAttention
from ..nn.hard import HardAttention
from ..nn.luong import LuongAttention
from ._rnn import check_tokens, encode_padded, loss_targets, make_rnn, masked_mean, source_mask  # importable here too

__all__ = ["Seq2Seq", "Seq2SeqOutput", "GreedyOutput", "check_tokens", "source_mask", "make_rnn", "encode_padded"]

_NAMES = ("additive", "luong-dot", "luong-general", "luong-concat", "local-m", "local-p", "coverage", "hard")


class Seq2SeqOutput(NamedTuple):
    """logits ``(B, T, V)``; weights ``(B, T, S)``; coverage_loss ``(B, T)`` (eq. 12 of See et al.) or None."""

    logits: torch.Tensor
    weights: torch.Tensor
    coverage_loss: torch.Tensor | None


class GreedyOutput(NamedTuple):
    """ids ``(B, T)``; weights ``(B, T, S)`` (0 after a sample's ``eos``); lengths ``(B,)`` (ids up to ``eos``)."""

    ids: torch.Tensor
    weights: torch.Tensor
    lengths: torch.Tensor


def _build(spec, dim, window):
    if isinstance(spec, nn.Module):
        return spec
    if isinstance(spec, str):
        if spec not in _NAMES:
            raise ArgumentError(f"Seq2Seq: attention must be one of {_NAMES}, a module or a factory; got {spec!r}")
        if spec == "additive":
            return AdditiveAttention(dim)
        if spec.startswith("luong-"):
            return LuongAttention(dim, score=spec[len("luong-"):])
        if spec.startswith("local-"):
            return LuongAttention(dim, score="general", mode=spec, window=window)
        if spec == "coverage":
            return CoverageAttention(dim)
        return HardAttention(dim, mode="argmax", straight_through=True)
    if callable(spec):
        module = spec(dim, dim)
        if isinstance(module, nn.Module):
            return module
    raise ArgumentError(f"Seq2Seq: attention must be one of {_NAMES}, an nn.Module or a factory "
                        f"(query_dim, key_dim) -> nn.Module; got {spec!r}")


class Seq2Seq(nn.Module):
    """Attention-based RNN encoder-decoder: any attention module aligns the decoder to the source.

    Bahdanau, Cho & Bengio 2015, "Neural Machine Translation by Jointly Learning to Align
    and Translate", ICLR, arXiv:1409.0473 (bidirectional encoder, eqs. 5-6 additive
    alignment); Luong, Pham & Manning 2015, "Effective Approaches to Attention-based
    Neural Machine Translation", EMNLP, arXiv:1508.04025 (decoder, eqs. 5-10)::

        h_s = Encoder(E_src x)_s,           h_t = RNN(E_tgt y_{t-1}, h_{t-1}),   h_0 = [h_fwd; h_bwd] final
        a_t = align(h_t, h_s) (any module),  c_t = sum_s a_t(s) h_s
        h~_t = tanh(W_c [c_t; h_t]),         p(y_t | y_<t, x) = softmax(W_s h~_t)            (Luong eqs. 5-6)

    Notation: ``E_src, E_tgt`` = ``src_embed, tgt_embed``; ``W_c`` = ``combine`` (the
    Luong modules use their own ``w_c``); ``W_s`` = ``out``; ``a_t`` = ``weights``.
    ``attention``: "additive" (Bahdanau's score), "luong-dot" / "luong-general" /
    "luong-concat" (global), "local-m" / "local-p" (general score, window ``window``),
    "coverage" (See et al. 2017, arXiv:1704.04368, eqs. 10-12: the per-step coverage
    loss is returned), "hard" (argmax with the straight-through softmax gradient), an
    ``nn.Module`` or a factory ``(query_dim, key_dim) -> nn.Module``. A custom module is
    called ``module(h (B, T, H), memory (B, S, H), mask=(B, 1, S) bool)`` and returns
    ``(context (B, T, H), weights (B, T, S), ...)`` as the attnkit modules do.

    Differences from the paper: one decoder for every score, Luong's (the query is the
    current state ``h_t``, not Bahdanau's ``s_{i-1}``, and no input feeding), so the
    teacher-forced decoder runs over all steps at once; one layer; the decoder starts
    from the encoder's final states (both directions concatenated); source padding by
    mask (True = real token, left-aligned; a sample with no token gets context 0).

    Shapes:
        src ``(B, S)``, tgt_in ``(B, T)`` ids -> logits ``(B, T, V)``, weights ``(B, T, S)``.

    Complexity: ``O(B (S + T) H^2)`` for the RNNs, ``O(B T S H)`` for attention.

    Args:
        src_vocab: source vocabulary size.
        tgt_vocab: target vocabulary size ``V``.
        embed_dim: embedding size.
        hidden_dim: ``H``, the decoder state and the encoder output size (even if bidirectional).
        rnn: "gru" or "lstm".
        bidirectional: bidirectional encoder (``H // 2`` units per direction).
        attention: see above.
        window: ``D`` of the local attentions.

    Example:
        >>> import torch
        >>> from attnkit.models.seq2seq import Seq2Seq
        >>> _ = torch.manual_seed(0)
        >>> model = Seq2Seq(11, 13, embed_dim=6, hidden_dim=8, attention="luong-general")
        >>> src, tgt_in = torch.randint(0, 11, (2, 7)), torch.randint(0, 13, (2, 5))
        >>> out = model(src, tgt_in, src_lengths=torch.tensor([7, 4]))
        >>> out.logits.shape, out.weights.shape, out.weights[1, :, 4:].abs().sum().item()
        (torch.Size([2, 5, 13]), torch.Size([2, 5, 7]), 0.0)
        >>> model.greedy_decode(src, max_len=3, bos=1).ids.shape
        torch.Size([2, 3])
    """

    def __init__(self, src_vocab: int, tgt_vocab: int, *, embed_dim: int = 32, hidden_dim: int = 64,
                 rnn: str = "gru", bidirectional: bool = True, attention="additive", window: int = 2):
        super().__init__()
        for name, value in (("src_vocab", src_vocab), ("tgt_vocab", tgt_vocab), ("embed_dim", embed_dim),
                            ("hidden_dim", hidden_dim)):
            check_int("Seq2Seq", name, value, 1)
        self.src_vocab, self.tgt_vocab = src_vocab, tgt_vocab
        self.src_embed, self.tgt_embed = nn.Embedding(src_vocab, embed_dim), nn.Embedding(tgt_vocab, embed_dim)
        self.encoder = make_rnn("Seq2Seq", rnn, embed_dim, hidden_dim, bidirectional)
        self.decoder = make_rnn("Seq2Seq", rnn, embed_dim, hidden_dim, False)
        self.attention = _build(attention, hidden_dim, window)
        self.combine = None if isinstance(self.attention, LuongAttention) else nn.Linear(2 * hidden_dim, hidden_dim,
                                                                                        bias=False)
        self.out = nn.Linear(hidden_dim, tgt_vocab)

    def encode(self, src, src_lengths=None, src_mask=None):
        """``(memory (B, S, H), keep (B, S), lengths (B,), decoder start state)``."""
        check_tokens("Seq2Seq", "src", src, self.src_vocab)
        keep, lengths = source_mask("Seq2Seq", src.shape, src.device, src_lengths, src_mask)
        memory, state = encode_padded(self.encoder, self.src_embed(src), lengths)
        return memory, keep, lengths, state

    def _attend(self, h, memory, keep, lengths, step, coverage):
        """``(h~ (B, T, H), weights (B, T, S), coverage, coverage loss)`` for decoder states ``h``."""
        m, mask = self.attention, keep[:, None, :]
        if isinstance(m, LuongAttention):
            out = m(h, memory, mask=mask, step=step, source_lengths=lengths)
            return out.hidden, out.weights, coverage, None
        loss = None
        if isinstance(m, CoverageAttention):
            context, weights, coverage, loss = m(h, memory, coverage=coverage, mask=mask)
        else:
            context, weights = m(h, memory, mask=mask)[:2]
        return torch.tanh(self.combine(torch.cat([context, h], -1))), weights, coverage, loss

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, *, src_lengths: torch.Tensor | None = None,
                src_mask: torch.Tensor | None = None) -> Seq2SeqOutput:
        """Teacher-forced pass: ``tgt_in[:, t]`` is ``y_{t-1}`` (BOS first); give at most one of lengths/mask."""
        memory, keep, lengths, state = self.encode(src, src_lengths, src_mask)
        check_tokens("Seq2Seq", "tgt_in", tgt_in, self.tgt_vocab, batch=src.shape[0], min_len=1)
        h, _ = self.decoder(self.tgt_embed(tgt_in), state)  # (B, T, H)
        hidden, weights, _, loss = self._attend(h, memory, keep, lengths, 0, None)
        return Seq2SeqOutput(self.out(hidden), weights, loss)

    @staticmethod
    def loss(output: Seq2SeqOutput, target: torch.Tensor, *, mask: torch.Tensor | None = None,
             coverage_weight: float = 1.0) -> torch.Tensor:
        """Mean over kept target tokens of ``-log p(y_t) + coverage_weight * covloss_t`` (See et al. eq. 13).

        Kept: ``mask`` (True = scored; None = every position) minus the targets equal to -100 (the tasks'
        ``IGNORE_INDEX``), which are never scored; the other targets must lie in ``[0, V)``.
        """
        target, keep = loss_targets("Seq2Seq.loss", target, mask, output.logits.shape[:2], output.logits.shape[-1])
        per_token = F.cross_entropy(output.logits.transpose(1, 2), target, reduction="none")  # (B, T)
        if output.coverage_loss is not None:
            per_token = per_token + coverage_weight * output.coverage_loss
        return masked_mean(per_token, keep)

    @torch.no_grad()
    def greedy_decode(self, src: torch.Tensor, *, src_lengths: torch.Tensor | None = None,
                      src_mask: torch.Tensor | None = None, max_len: int, bos: int,
                      eos: int | None = None) -> GreedyOutput:
        """Feed back the argmax token ``max_len`` times (a sample stops at ``eos``, then repeats it)."""
        check_int("Seq2Seq", "max_len", max_len, 0)
        for name, value in (("bos", bos), ("eos", eos)):
            if value is not None and check_int("Seq2Seq", name, value, 0) >= self.tgt_vocab:
                raise ArgumentError(f"Seq2Seq: {name} must be < tgt_vocab={self.tgt_vocab}; got {value}")
        memory, keep, lengths, state = self.encode(src, src_lengths, src_mask)
        b, s = keep.shape
        token = torch.full((b, 1), bos, dtype=torch.long, device=src.device)
        done = torch.zeros(b, dtype=torch.bool, device=src.device)
        ids, weights, coverage = [], [], None
        for t in range(max_len):
            h, state = self.decoder(self.tgt_embed(token), state)  # (B, 1, H)
            hidden, w, coverage, _ = self._attend(h, memory, keep, lengths, t, coverage)
            token = torch.where(done[:, None], eos if eos is not None else 0, self.out(hidden).argmax(-1))
            ids.append(token)
            weights.append(w.masked_fill(done[:, None, None], 0.0))
            if eos is not None:
                done = done | (token[:, 0] == eos)
        if not ids:
            return GreedyOutput(keep.new_zeros(b, 0, dtype=torch.long), memory.new_zeros(b, 0, s),
                                keep.new_zeros(b, dtype=torch.long))
        ids = torch.cat(ids, 1)
        ended = ids == eos if eos is not None else torch.zeros_like(ids, dtype=torch.bool)
        lengths = torch.where(ended.any(1), ended.int().argmax(1) + 1, torch.full_like(ids[:, 0], max_len))
        return GreedyOutput(ids, torch.cat(weights, 1), lengths)
