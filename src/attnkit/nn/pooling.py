"""Attention pooling with a learned context vector, and the hierarchical attention network built on it."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ..core import attention
from ..costing.attend import attend
from ..costing.spec import Spec
from ..costing.tally import dtype_of, ones, randn
from ..errors import ArgumentError
from ..registry.entry import Entry, register
from ._inputs import check_keep_mask, check_sequence, check_shape

__all__ = ["AttentionPooling", "PoolingOutput", "HierarchicalAttention", "HierarchicalOutput"]


class PoolingOutput(NamedTuple):
    """pooled ``(B, D)``; weights ``(B, n)``."""

    pooled: torch.Tensor
    weights: torch.Tensor


class AttentionPooling(nn.Module):
    """Context-based attention pooling: a learned context vector scores every position.

    Yang et al. 2016, "Hierarchical Attention Networks for Document Classification",
    NAACL-HLT, eqs. 5-7::

        u_t = tanh(W h_t + b),   a_t = softmax_t(u_t^T u_w),   s = sum_t a_t h_t

    Notation: ``h_t`` = ``x[:, t]``, ``W, b`` = ``proj``, ``u_w`` = ``context``,
    ``a`` = ``weights``, ``s`` = ``pooled``.

    Differences from the paper: a padding mask (True = keep); a row with no kept
    position pools to 0 with weights 0.

    Shapes:
        x ``(B, n, dim)``, mask ``(B, n)`` -> pooled ``(B, dim)``, weights ``(B, n)``.

    Complexity: ``O(B n dim attn_dim)`` time, ``O(B n attn_dim)`` memory.

    Args:
        dim: features of each position.
        attn_dim: size of ``u_t`` and ``u_w``; default ``dim``.

    Example:
        >>> import torch
        >>> from attnkit.nn.pooling import AttentionPooling
        >>> _ = torch.manual_seed(0)
        >>> pool = AttentionPooling(6, 4)
        >>> pooled, weights = pool(torch.randn(2, 5, 6), mask=torch.tensor([[True] * 5, [True] * 3 + [False] * 2]))
        >>> pooled.shape, weights[1, 3:].tolist()
        (torch.Size([2, 6]), [0.0, 0.0])
    """

    def __init__(self, dim: int, attn_dim: int | None = None):
        super().__init__()
        attn_dim = dim if attn_dim is None else attn_dim
        self.dim = dim
        self.proj = nn.Linear(dim, attn_dim)
        self.context = nn.Parameter(torch.empty(attn_dim).uniform_(-attn_dim ** -0.5, attn_dim ** -0.5))

    def forward(self, x: torch.Tensor, *, mask: torch.Tensor | None = None) -> PoolingOutput:
        """Pool ``x`` over its positions; ``mask`` (B, n) bool, True = keep."""
        check_sequence("AttentionPooling", "x", x, self.dim, length="length", like=self)
        check_keep_mask("AttentionPooling", "mask", mask, *x.shape[:2], true_means="keep", dims="")
        u = torch.tanh(self.proj(x))  # (B, n, A)
        query = self.context.to(u.dtype).expand(x.shape[0], 1, -1)  # (B, 1, A)
        out = attention(query, u, x, score="dot", scale=1.0, return_weights=True,
                        mask=None if mask is None else mask[:, None, :])
        return PoolingOutput(out.output[:, 0], out.weights[:, 0])


def _left_aligned_lengths(who, name, mask):
    lengths = mask.sum(-1)
    if not torch.equal(mask, torch.arange(mask.shape[-1], device=mask.device) < lengths[..., None]):
        raise ArgumentError(f"{who}: {name} must be left-aligned (True then False in each row) for the GRU encoder")
    return lengths


class _BiGRU(nn.Module):
    """Bidirectional GRU over padded rows; rows of length 0 give zeros."""

    def __init__(self, input_dim: int, output_dim: int):
        super().__init__()
        if output_dim % 2:
            raise ArgumentError(f"HierarchicalAttention: hidden_dim must be even for the bidirectional GRU; "
                                f"got {output_dim}")
        self.output_dim = output_dim
        self.gru = nn.GRU(input_dim, output_dim // 2, batch_first=True, bidirectional=True)

    def forward(self, x, lengths):
        out = x.new_zeros(x.shape[0], x.shape[1], self.output_dim)
        rows = (lengths > 0).nonzero().flatten()
        if rows.numel():
            packed = pack_padded_sequence(x[rows], lengths[rows].cpu(), batch_first=True, enforce_sorted=False)
            h, _ = pad_packed_sequence(self.gru(packed)[0], batch_first=True, total_length=x.shape[1])
            out = out.index_copy(0, rows, h)
        return out


def _encoder(spec, input_dim, hidden_dim):
    """(module or None for identity, output dim)."""
    if spec == "gru":
        return _BiGRU(input_dim, hidden_dim), hidden_dim
    if spec == "identity":
        return None, input_dim
    if isinstance(spec, nn.Module):
        return spec, hidden_dim
    raise ArgumentError(f"HierarchicalAttention: an encoder must be 'gru', 'identity' or an nn.Module; got {spec!r}")


class HierarchicalOutput(NamedTuple):
    """document ``(B, D)``; word_weights ``(B, S, W)``; sentence_weights ``(B, S)``."""

    document: torch.Tensor
    word_weights: torch.Tensor
    sentence_weights: torch.Tensor


class HierarchicalAttention(nn.Module):
    """Hierarchical attention network: words -> sentence vectors -> document vector.

    Yang et al. 2016, "Hierarchical Attention Networks for Document Classification",
    NAACL-HLT, eqs. 2-10: a bidirectional GRU encodes the words of each sentence,
    :class:`AttentionPooling` (eqs. 5-7) pools them into a sentence vector, and the
    same two steps at the sentence level (eqs. 8-10) give the document vector::

        h_it = [GRU_fwd(x_it); GRU_bwd(x_it)],   s_i = sum_t a_it h_it,   a_it = softmax_t(tanh(W_w h_it + b_w)^T u_w)
        h_i = [GRU_fwd(s_i); GRU_bwd(s_i)],      v = sum_i a_i h_i,       a_i = softmax_i(tanh(W_s h_i + b_s)^T u_s)

    Notation: ``x_it`` = ``x[:, i, t]``; ``a_it`` = ``word_weights``; ``a_i`` =
    ``sentence_weights``; ``v`` = ``document``.

    Differences from the paper: inputs are word vectors (the embedding ``W_e`` and the
    classifier stay outside); padding masks at both levels; the encoders are
    pluggable: ``"gru"`` (the paper's, ``hidden_dim // 2`` units per direction),
    ``"identity"`` or any module mapping ``(N, L, in) -> (N, L, hidden_dim)``, which
    sees padded positions as given and whose outputs at padded positions are zeroed.

    Shapes:
        x ``(B, S, W, input_dim)``, word_mask ``(B, S, W)``, sentence_mask ``(B, S)``
        (default: sentences with at least one word) -> document ``(B, D)``,
        word_weights ``(B, S, W)``, sentence_weights ``(B, S)``.

    Complexity: ``O(B S W hidden^2)`` for the GRUs, ``O(B S W hidden attn_dim)`` for attention.

    Args:
        input_dim: features of a word vector.
        hidden_dim: features of an encoder's output (the annotation ``h``).
        attn_dim: size of the context vectors; default the annotation size.
        word_encoder: ``"gru"``, ``"identity"`` or an ``nn.Module``.
        sentence_encoder: ``"gru"``, ``"identity"`` or an ``nn.Module``.

    Example:
        >>> import torch
        >>> from attnkit.nn.pooling import HierarchicalAttention
        >>> _ = torch.manual_seed(0)
        >>> han = HierarchicalAttention(6, 8)
        >>> word_mask = torch.ones(2, 3, 4, dtype=torch.bool)
        >>> doc, word_w, sent_w = han(torch.randn(2, 3, 4, 6), word_mask=word_mask)
        >>> doc.shape, word_w.shape, sent_w.shape
        (torch.Size([2, 8]), torch.Size([2, 3, 4]), torch.Size([2, 3]))
    """

    def __init__(self, input_dim: int, hidden_dim: int, *, attn_dim: int | None = None,
                 word_encoder: str | nn.Module = "gru", sentence_encoder: str | nn.Module = "gru"):
        super().__init__()
        self.input_dim = input_dim
        self.word_encoder, word_dim = _encoder(word_encoder, input_dim, hidden_dim)
        self.sentence_encoder, self.output_dim = _encoder(sentence_encoder, word_dim, hidden_dim)
        self.word_attention = AttentionPooling(word_dim, attn_dim)
        self.sentence_attention = AttentionPooling(self.output_dim, attn_dim)

    @staticmethod
    def _encode(encoder, x, mask, name):
        if encoder is None:
            return x.masked_fill(~mask[..., None], 0.0)
        if isinstance(encoder, _BiGRU):
            return encoder(x, _left_aligned_lengths("HierarchicalAttention", name, mask))
        return encoder(x).masked_fill(~mask[..., None], 0.0)

    def forward(self, x: torch.Tensor, *, word_mask: torch.Tensor | None = None,
                sentence_mask: torch.Tensor | None = None) -> HierarchicalOutput:
        """Encode a batch of documents; masks are bool, True = a real word / sentence."""
        check_shape("HierarchicalAttention", "x", x, lambda t: t.dim() == 4 and t.shape[-1] == self.input_dim,
                    f"have shape (batch, sentences, words, {self.input_dim})")
        b, s, w, d = x.shape
        word_mask = check_keep_mask("HierarchicalAttention", "word_mask", word_mask, b, s, w, true_means="keep",
                                    dims="")
        if word_mask is None:
            word_mask = torch.ones(b, s, w, dtype=torch.bool, device=x.device)
        if sentence_mask is None:
            sentence_mask = word_mask.any(-1)
        check_keep_mask("HierarchicalAttention", "sentence_mask", sentence_mask, b, s, true_means="keep", dims="")
        flat_mask = word_mask.reshape(b * s, w)
        h = self._encode(self.word_encoder, x.reshape(b * s, w, d), flat_mask, "word_mask")  # (B*S, W, Dw)
        sentences, word_weights = self.word_attention(h, mask=flat_mask)  # (B*S, Dw), (B*S, W)
        sentences = sentences.reshape(b, s, sentences.shape[-1])  # explicit sizes: b or s may be 0
        hs = self._encode(self.sentence_encoder, sentences, sentence_mask, "sentence_mask")  # (B, S, D)
        document, sentence_weights = self.sentence_attention(hs, mask=sentence_mask)
        return HierarchicalOutput(document, word_weights.reshape(b, s, w), sentence_weights)


def _pooling_example():
    g = torch.Generator().manual_seed(0)
    return AttentionPooling(8, 6), (torch.randn(2, 7, 8, generator=g),)


def _han_example():
    g = torch.Generator().manual_seed(0)
    return HierarchicalAttention(8, 6), (torch.randn(2, 3, 5, 8, generator=g),)


# Cost of the pooling family (here, memory, co-attention, segment). Masks are taken as all-true (full
# sequences). A call of attention() on constant queries/keys (a mean, or weights given as a bias) passes no
# gradient through its score product; its backward counts only what needs a gradient.
POOL_SCORES = {"score": "dot", "scale": 1.0, "return_weights": True}
POOL_FORMULA = "scores 2 B Lq n A, weights @ x 2 B Lq n D"


def count_pool(t, label, b, lq, lk, d, dv, dt):
    """A learned query over ``lk`` rows (:class:`AttentionPooling`, the co-attention steps)."""
    attend(t, label, b, 1, lq, lk, d, dv, dtype=dt, **POOL_SCORES)


def count_mean(t, label, b, groups, n, dv, dt):
    """A mean per group as attention with zero queries and keys: only ``weights @ x`` has a gradient."""
    attend(t, label, b, 1, groups, n, 1, dv, dtype=dt, grads=(False, False, True), mask=ones(1, 1, groups, n),
           **POOL_SCORES)


def _pooling_count(t, s, module=None):
    b, n, d, a = s["batch"], s["length"], s["dim"], s["attn_dim"]
    t.mm("u = tanh(W h + b)", 1, b * n, d, a)
    t.inter(b * n * a)
    count_pool(t, "", b, 1, n, a, d, dtype_of(s))


def _gru(t, label, sequences, steps, fan_in, hidden):
    """A bidirectional GRU over full sequences: input products once, hidden products per step.

    The first step of each direction multiplies the zero initial state, which needs no gradient.
    """
    tokens = sequences * steps
    for direction in ("forward", "backward"):
        t.mm(f"{label} GRU ({direction}): inputs", 1, tokens, fan_in, 3 * hidden)
        t.mm(f"{label} GRU ({direction}): hidden state", 1, tokens - sequences, hidden, 3 * hidden)
        t.mm(f"{label} GRU ({direction}): hidden state", 1, sequences, hidden, 3 * hidden, grads=1)
        t.ew(f"{label} GRU ({direction}): gates", tokens * hidden, 12)
        t.inter(tokens * hidden)


def _han_count(t, s, module=None):
    b, ns, nw, dt = s["batch"], s["sentences"], s["words"], dtype_of(s)
    word_dim = s["hidden_dim"] if s["word_encoder"] == "gru" else s["input_dim"]
    out_dim = s["hidden_dim"] if s["sentence_encoder"] == "gru" else word_dim
    a_word, a_sent = s["attn_dim"] or word_dim, s["attn_dim"] or out_dim
    if s["word_encoder"] == "gru":
        _gru(t, "word", b * ns, nw, s["input_dim"], s["hidden_dim"] // 2)
    t.mm("word pooling: tanh(W h + b)", 1, b * ns * nw, word_dim, a_word)
    count_pool(t, "word pooling: ", b * ns, 1, nw, a_word, word_dim, dt)
    if s["sentence_encoder"] == "gru":
        _gru(t, "sentence", b, ns, word_dim, s["hidden_dim"] // 2)
    t.mm("sentence pooling: tanh(W h + b)", 1, b * ns, out_dim, a_sent)
    count_pool(t, "sentence pooling: ", b, 1, ns, a_sent, out_dim, dt)


def _han_config(m):
    def kind(encoder):
        if encoder is None or isinstance(encoder, _BiGRU):
            return "identity" if encoder is None else "gru"
        raise ArgumentError("cost: hierarchical-attention with a custom encoder module has no cost formula")
    word, sentence = kind(m.word_encoder), kind(m.sentence_encoder)
    word_dim, a_word = m.word_attention.dim, m.word_attention.proj.out_features
    default = a_word == word_dim and m.sentence_attention.proj.out_features == m.output_dim
    return {"input_dim": m.input_dim, "hidden_dim": word_dim if word == "gru" else m.output_dim,
            "attn_dim": None if default else a_word, "word_encoder": word, "sentence_encoder": sentence}


def _x_inputs(*names):
    return lambda s, m: (m, (randn(*(s[k] for k in names), dtype=dtype_of(s)),))


_YANG = "Yang et al. 2016, NAACL-HLT, 'Hierarchical Attention Networks for Document Classification'"
register(Entry("attention-pooling", AttentionPooling, f"{_YANG}, eqs. 5-7",
               "O(n D A)", "pool a sequence with softmax(tanh(W h + b)^T u_w) over a learned context vector",
               family="module", example=_pooling_example,
               spec=Spec({"batch": 2, "length": 7, "dim": 8, "attn_dim": 6, "dtype": "float32"}, _pooling_count,
                         _x_inputs("batch", "length", "dim"), "u = tanh(W h + b): 2 B n D A; " + POOL_FORMULA,
                         make=lambda s: AttentionPooling(s["dim"], s["attn_dim"]).to(dtype_of(s)),
                         module_type=AttentionPooling,
                         config=lambda m: {"dim": m.dim, "attn_dim": m.proj.out_features})))
register(Entry("hierarchical-attention", HierarchicalAttention, f"{_YANG}, eqs. 2-10",
               "O(S W (H^2 + H A))", "BiGRU + attention pooling over words, then over sentences",
               family="module", example=_han_example,
               spec=Spec({"batch": 2, "sentences": 3, "words": 5, "input_dim": 8, "hidden_dim": 6, "attn_dim": None,
                          "word_encoder": "gru", "sentence_encoder": "gru", "dtype": "float32"},
                         _han_count, _x_inputs("batch", "sentences", "words", "input_dim"),
                         "per level: BiGRU 2 x 2 tokens (in + h) 3h, pooling 2 tokens D A + " + POOL_FORMULA,
                         make=lambda s: HierarchicalAttention(s["input_dim"], s["hidden_dim"], attn_dim=s["attn_dim"],
                                                              word_encoder=s["word_encoder"],
                                                              sentence_encoder=s["sentence_encoder"]).to(dtype_of(s)),
                         length=("words",), module_type=HierarchicalAttention, config=_han_config)))
