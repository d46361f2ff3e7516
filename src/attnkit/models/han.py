"""Hierarchical attention network for document classification (Yang et al. 2016)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from ..errors import ArgumentError, check_int
from ..nn._inputs import check_keep_mask, check_lengths, check_shape
from ..nn.pooling import HierarchicalAttention
from ._rnn import check_tokens

__all__ = ["HierarchicalAttentionNetwork", "HANOutput"]

_WHO = "HierarchicalAttentionNetwork"


class HANOutput(NamedTuple):
    """logits ``(B, num_classes)``; sentence_weights ``alpha_i (B, S)``; word_weights ``alpha_it (B, S, W)``."""

    logits: torch.Tensor
    sentence_weights: torch.Tensor
    word_weights: torch.Tensor


class HierarchicalAttentionNetwork(nn.Module):
    """Document classifier: word attention builds sentence vectors, sentence attention the document vector.

    Yang, Yang, Dyer, He, Smola & Hovy 2016, "Hierarchical Attention Networks for
    Document Classification", NAACL-HLT, eqs. 1-11::

        x_it = W_e w_it                                                  (1)
        s_i = sum_t alpha_it h_it,  alpha_it = softmax_t(tanh(W_w h_it + b_w)^T u_w),  h_it = BiGRU(x_i.)_t  (2-7)
        v = sum_i alpha_i h_i,      alpha_i = softmax_i(tanh(W_s h_i + b_s)^T u_s),     h_i = BiGRU(s_.)_i   (8-10)
        p = softmax(W_c v + b_c)                                         (11)

    Notation: ``W_e`` = ``embed``; eqs. 2-10 are
    :class:`~attnkit.nn.pooling.HierarchicalAttention` (``encoder``; its docstring maps
    ``W_w, u_w, W_s, u_s``); ``W_c, b_c`` = ``classifier``; ``logits`` are ``W_c v + b_c``
    (eq. 11 before the softmax, for ``cross_entropy``).

    Differences from the paper: padding masks at both levels (True = a real word /
    sentence, left-aligned): padded words and sentences get weight exactly 0 and never
    enter the GRUs; a document with no sentence gets ``v = 0``.

    Shapes:
        ids ``(B, S, W)``, word_mask ``(B, S, W)``, sentence_lengths ``(B,)`` -> logits ``(B, num_classes)``,
        sentence_weights ``(B, S)``, word_weights ``(B, S, W)``.

    Complexity: ``O(B S W (hidden^2 + hidden attn_dim))``.

    Args:
        vocab_size: words in the vocabulary.
        num_classes: output classes.
        embed_dim: word embedding size.
        hidden_dim: annotation size (even: ``hidden_dim // 2`` GRU units per direction).
        attn_dim: size of ``u_w`` and ``u_s``; default ``hidden_dim``.
        padding_idx: if given, the word mask defaults to ``ids != padding_idx``.

    Example:
        >>> import torch
        >>> from attnkit.models.han import HierarchicalAttentionNetwork
        >>> _ = torch.manual_seed(0)
        >>> han = HierarchicalAttentionNetwork(20, 3, embed_dim=6, hidden_dim=8, padding_idx=0)
        >>> ids = torch.tensor([[[4, 5, 0], [7, 0, 0]], [[9, 2, 3], [0, 0, 0]]])  # 2 docs, 2 sentences, 3 words
        >>> logits, sent_w, word_w = han(ids)
        >>> logits.shape, sent_w[1].tolist(), word_w[0, 1].tolist()
        (torch.Size([2, 3]), [1.0, 0.0], [1.0, 0.0, 0.0])
    """

    def __init__(self, vocab_size: int, num_classes: int, *, embed_dim: int = 32, hidden_dim: int = 32,
                 attn_dim: int | None = None, padding_idx: int | None = None):
        super().__init__()
        check_int(_WHO, "vocab_size", vocab_size, 1)
        check_int(_WHO, "num_classes", num_classes, 1)
        if padding_idx is not None and check_int(_WHO, "padding_idx", padding_idx, 0) >= vocab_size:
            raise ArgumentError(f"{_WHO}: padding_idx must be < vocab_size={vocab_size}; got {padding_idx}")
        self.vocab_size, self.padding_idx = vocab_size, padding_idx
        self.embed = nn.Embedding(vocab_size, embed_dim, padding_idx=padding_idx)
        self.encoder = HierarchicalAttention(embed_dim, hidden_dim, attn_dim=attn_dim)
        self.classifier = nn.Linear(hidden_dim, num_classes)

    def _masks(self, ids, word_mask, sentence_lengths):
        b, s, w = ids.shape
        if word_mask is None:
            word_mask = ids != self.padding_idx if self.padding_idx is not None else torch.ones_like(ids, dtype=bool)
        else:
            check_keep_mask(_WHO, "word_mask", word_mask, b, s, w, true_means="a real word", dims="(the shape of ids)")
        if sentence_lengths is None:
            return word_mask, None
        check_lengths(_WHO, "sentence_lengths", sentence_lengths, b, s)
        sentence_mask = torch.arange(s, device=ids.device) < sentence_lengths.to(ids.device)[:, None]  # (B, S)
        return word_mask & sentence_mask[..., None], sentence_mask

    def forward(self, ids: torch.Tensor, *, word_mask: torch.Tensor | None = None,
                sentence_lengths: torch.Tensor | None = None) -> HANOutput:
        """Classify documents of token ids ``(B, S, W)``; word_mask: True = a real word."""
        check_shape(_WHO, "ids", ids, lambda t: t.dim() == 3, "have shape (batch, sentences, words)")
        check_tokens(_WHO, "ids", ids.flatten(1), self.vocab_size)
        word_mask, sentence_mask = self._masks(ids, word_mask, sentence_lengths)
        if ids.shape[0] == 0 or ids.shape[1] == 0:  # no document or no sentence slot: v = 0, as for an all-padding
            b, w = ids.shape[0], self.classifier.weight  # document (the encoder cannot reshape empty batches)
            return HANOutput(self.classifier(w.new_zeros(b, w.shape[1])), w.new_zeros(*ids.shape[:2]),
                             w.new_zeros(*ids.shape))
        doc, word_weights, sentence_weights = self.encoder(self.embed(ids), word_mask=word_mask,
                                                           sentence_mask=sentence_mask)
        return HANOutput(self.classifier(doc), sentence_weights, word_weights)
