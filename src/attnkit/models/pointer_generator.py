"""Pointer-generator network with coverage for abstractive summarisation (See et al. 2017)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from ..errors import ArgumentError, ShapeError, check_int
from ..nn.additive import AdditiveAttention
from ..nn.coverage import CoverageAttention, coverage_loss
from ._rnn import check_tokens, encode_padded, loss_targets, make_rnn, masked_mean, source_mask

__all__ = ["PointerGenerator", "PointerGeneratorOutput"]

_WHO = "PointerGenerator"


class PointerGeneratorOutput(NamedTuple):
    """log_probs ``(B, T, V + num_oov)`` of the final distribution (eq. 9); attention ``a^t (B, T, S)``;
    p_gen ``(B, T)`` (eq. 8); coverage_loss ``(B, T)``: ``sum_i min(a_i^t, c_i^t)`` of each step (eq. 12)."""

    log_probs: torch.Tensor
    attention: torch.Tensor
    p_gen: torch.Tensor
    coverage_loss: torch.Tensor


def _log(p):
    """``log p`` with ``-inf`` where ``p == 0`` and a zero (not NaN) gradient there."""
    positive = p > 0
    return torch.where(positive, torch.where(positive, p, torch.ones_like(p)).log(), torch.full_like(p, float("-inf")))


class PointerGenerator(nn.Module):
    """Pointer-generator: mix generating from the vocabulary with copying a source token by attention.

    See, Liu & Manning 2017, "Get To The Point: Summarization with Pointer-Generator
    Networks", ACL, arXiv:1704.04368, eqs. 1-13::

        e_i^t = v^T tanh(W_h h_i + W_s s_t + w_c c_i^t + b_attn),   a^t = softmax(e^t)   (1, 11; w_c only with coverage)
        h*_t = sum_i a_i^t h_i                                                             (2)
        P_vocab = softmax(V'(V [s_t; h*_t] + b) + b')                                      (4)
        p_gen = sigmoid(w_h*^T h*_t + w_s^T s_t + w_x^T x_t + b_ptr)                       (8)
        P(w) = p_gen P_vocab(w) + (1 - p_gen) sum_{i: w_i = w} a_i^t                       (9)
        c^t = sum_{t' < t} a^{t'},   covloss_t = sum_i min(a_i^t, c_i^t),   loss_t = -log P(w*_t) + lambda covloss_t

    Notation: ``h_i`` = encoder outputs (a bidirectional LSTM), ``s_t`` = decoder states
    (an LSTM fed ``x_t`` = the embedding of ``tgt_in[:, t]``), ``a^t`` = ``attention``;
    ``W_h, W_s, b_attn, w_c, v`` live in ``attention``
    (:class:`~attnkit.nn.coverage.CoverageAttention`, or
    :class:`~attnkit.nn.additive.AdditiveAttention` with a bias for eq. 1 when
    ``coverage=False``); ``V, b`` = ``vocab_hidden``; ``V', b'`` = ``vocab_out``;
    ``[w_h*; w_s; w_x], b_ptr`` = ``switch``. Extended vocabulary: ``src_ext_ids`` numbers
    each source token in ``[0, V + num_oov)``, source OOVs getting ``V, V+1, ...``; a
    target id ``>= V`` is fed to the decoder as ``unk_id``.

    Differences from the paper: the decoder starts from the encoder's final states (the
    two directions concatenated) instead of a learned reduction; ``P(w) = 0`` gives
    ``log_probs = -inf`` (with zero gradient); source padding by mask (True = real token,
    left-aligned). ``coverage_loss`` is returned even without the coverage feature.

    Shapes:
        src, src_ext_ids ``(B, S)``, tgt_in ``(B, T)`` -> log_probs ``(B, T, V + num_oov)``,
        attention ``(B, T, S)``, p_gen and coverage_loss ``(B, T)``.

    Complexity: ``O(B (S + T) H^2)`` for the LSTMs, ``O(B T S A)`` for attention, ``O(B T (V H + S))`` for outputs.

    Args:
        vocab_size: ``V``.
        embed_dim: word embedding size (shared by encoder and decoder).
        hidden_dim: ``H``, encoder output and decoder state size (even).
        attn_dim: size of ``v``; default ``hidden_dim``.
        coverage: use the coverage feature ``w_c c_i^t`` in the scores (eq. 11).
        unk_id: the id fed to the decoder for an extended (OOV) target id.

    Example:
        >>> import torch
        >>> from attnkit.models.pointer_generator import PointerGenerator
        >>> _ = torch.manual_seed(0)
        >>> model = PointerGenerator(11, embed_dim=6, hidden_dim=8)
        >>> src = torch.tensor([[4, 1, 7, 1, 2], [3, 5, 6, 0, 0]])     # 1 = UNK
        >>> ext = torch.tensor([[4, 11, 7, 12, 2], [3, 5, 6, 0, 0]])  # two source OOVs: ids 11 and 12
        >>> out = model(src, torch.tensor([[2, 11, 3], [2, 5, 6]]), src_lengths=torch.tensor([5, 3]),
        ...             src_ext_ids=ext, num_oov=2)
        >>> out.log_probs.shape, out.p_gen.shape, torch.allclose(out.log_probs.exp().sum(-1), torch.ones(2, 3))
        (torch.Size([2, 3, 13]), torch.Size([2, 3]), True)
        >>> bool(out.log_probs[1, :, 11:].isinf().all())  # sample 1 has no OOV to copy
        True
    """

    def __init__(self, vocab_size: int, *, embed_dim: int = 32, hidden_dim: int = 64, attn_dim: int | None = None,
                 coverage: bool = True, unk_id: int = 1):
        super().__init__()
        check_int(_WHO, "vocab_size", vocab_size, 1)
        if check_int(_WHO, "unk_id", unk_id, 0) >= vocab_size:
            raise ArgumentError(f"{_WHO}: unk_id must be < vocab_size={vocab_size}; got {unk_id}")
        self.vocab_size, self.unk_id, self.coverage = vocab_size, unk_id, bool(coverage)
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.encoder = make_rnn(_WHO, "lstm", embed_dim, hidden_dim, True)
        self.decoder = make_rnn(_WHO, "lstm", embed_dim, hidden_dim, False)
        if self.coverage:
            self.attention = CoverageAttention(hidden_dim, hidden_dim, attn_dim)
        else:
            self.attention = AdditiveAttention(hidden_dim, hidden_dim, attn_dim, bias=True)
        self.vocab_hidden = nn.Linear(2 * hidden_dim, hidden_dim)
        self.vocab_out = nn.Linear(hidden_dim, vocab_size)
        self.switch = nn.Linear(2 * hidden_dim + embed_dim, 1)

    def _inputs(self, src, tgt_in, src_ext_ids, num_oov):
        check_int(_WHO, "num_oov", num_oov, 0)
        check_tokens(_WHO, "src", src, self.vocab_size)
        check_tokens(_WHO, "tgt_in", tgt_in, self.vocab_size + num_oov, batch=src.shape[0], min_len=1)
        if src_ext_ids is None:
            return src
        check_tokens(_WHO, "src_ext_ids", src_ext_ids, self.vocab_size + num_oov, batch=src.shape[0])
        if src_ext_ids.shape != src.shape:
            raise ShapeError(f"{_WHO}: src_ext_ids must have the shape of src {tuple(src.shape)}; "
                             f"got {tuple(src_ext_ids.shape)}")
        return src_ext_ids

    def _check_extended(self, src, ext, keep):
        """At real positions ``src_ext_ids`` repeats ``src``, except OOV ids (``>= V``), where ``src`` is unk."""
        fed = torch.where(ext >= self.vocab_size, self.unk_id, ext)  # what the encoder must have been fed
        wrong = keep & (fed != src)
        if bool(wrong.any()):
            b, i = (int(v) for v in wrong.nonzero()[0])
            raise ArgumentError(f"{_WHO}: src_ext_ids must equal src at real positions, with source OOVs (ids >= "
                                f"{self.vocab_size}) on unk_id={self.unk_id} in src; got src[{b}, {i}] = "
                                f"{int(src[b, i])}, src_ext_ids[{b}, {i}] = {int(ext[b, i])}")

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, *, src_lengths: torch.Tensor | None = None,
                src_mask: torch.Tensor | None = None, src_ext_ids: torch.Tensor | None = None,
                num_oov: int = 0) -> PointerGeneratorOutput:
        """Teacher-forced pass: ``tgt_in[:, t]`` is the previous word (ids may be extended)."""
        ext = self._inputs(src, tgt_in, src_ext_ids, num_oov)
        keep, lengths = source_mask(_WHO, src.shape, src.device, src_lengths, src_mask)
        self._check_extended(src, ext, keep)
        memory, state = encode_padded(self.encoder, self.embed(src), lengths)  # (B, S, H)
        x = self.embed(tgt_in.masked_fill(tgt_in >= self.vocab_size, self.unk_id))  # (B, T, E)
        s, _ = self.decoder(x, state)  # (B, T, H)
        if self.coverage:
            context, weights, _, cov_loss = self.attention(s, memory, mask=keep[:, None, :])
        else:
            context, weights = self.attention(s, memory, mask=keep[:, None, :])
            cov_loss = coverage_loss(weights, weights.cumsum(1) - weights)  # c^t = sum of the steps before
        p_vocab = torch.softmax(self.vocab_out(self.vocab_hidden(torch.cat([s, context], -1))), -1)  # (B, T, V)
        p_gen = torch.sigmoid(self.switch(torch.cat([context, s, x], -1))).squeeze(-1)  # (B, T)
        b, t = tgt_in.shape
        copy = weights.new_zeros(b, t, self.vocab_size + num_oov)
        copy = copy.scatter_add(-1, ext[:, None, :].expand(b, t, -1), weights)  # sum of a_i^t over w_i = w
        final = p_gen[..., None] * F.pad(p_vocab, (0, num_oov)) + (1 - p_gen)[..., None] * copy
        return PointerGeneratorOutput(_log(final), weights, p_gen, cov_loss)

    @staticmethod
    def loss(output: PointerGeneratorOutput, target: torch.Tensor, *, mask: torch.Tensor | None = None,
             coverage_weight: float = 1.0) -> torch.Tensor:
        """Eq. 13 averaged over the kept target tokens: ``-log P(w*_t) + coverage_weight * covloss_t``.

        ``output`` does not record whether the model uses coverage: for the paper's baseline
        (``coverage=False``, eq. 6: ``-log P(w*_t)`` alone) pass ``coverage_weight=0``. Kept tokens:
        ``mask`` (None = all) minus targets equal to -100 (the tasks' ``IGNORE_INDEX``); the other
        targets must lie in ``[0, V + num_oov)``.
        """
        logp = output.log_probs
        target, keep = loss_targets(f"{_WHO}.loss", target, mask, logp.shape[:2], logp.shape[-1])
        nll = -logp.gather(-1, target[..., None]).squeeze(-1)  # (B, T)
        return masked_mean(nll + coverage_weight * output.coverage_loss, keep)
