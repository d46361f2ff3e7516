"""HierarchicalAttentionNetwork (Yang et al. 2016) against a float64 per-document loop of eqs. 1-11, masks, training."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.models.han import HierarchicalAttentionNetwork

B, S, W, VOCAB, C, E, H = 2, 3, 5, 17, 4, 6, 8
PAD = 0
IDS = torch.tensor([[[3, 4, 5, 0, 0], [6, 7, 8, 9, 10], [11, 0, 0, 0, 0]],
                    [[12, 13, 0, 0, 0], [14, 15, 16, 2, 0], [0, 0, 0, 0, 0]]])  # doc 1: 2 sentences


def _model(seed=0):
    torch.manual_seed(seed)
    return HierarchicalAttentionNetwork(VOCAB, C, embed_dim=E, hidden_dim=H, attn_dim=7, padding_idx=PAD).double()


def _pool(pooling, h):
    """eqs. 5-7 / 8-10: u = tanh(W h + b); a = softmax(u . u_ctx); s = sum a h. h (n, D)."""
    u = torch.tanh(h @ pooling.proj.weight.T + pooling.proj.bias)
    scores = u @ pooling.context
    a = torch.exp(scores - scores.max()) / torch.exp(scores - scores.max()).sum()
    return (a[:, None] * h).sum(0), a


@torch.no_grad()
def _reference(m, ids, sentence_lengths):
    """Per document: real words only through the word BiGRU, real sentences only through the sentence BiGRU."""
    enc = m.encoder
    logits = torch.zeros(ids.shape[0], C, dtype=torch.float64)
    sent_w = torch.zeros(ids.shape[:2], dtype=torch.float64)
    word_w = torch.zeros(ids.shape, dtype=torch.float64)
    for b in range(ids.shape[0]):
        vectors = []
        for i in range(int(sentence_lengths[b])):
            n = int((ids[b, i] != PAD).sum())
            h = enc.word_encoder.gru(m.embed(ids[b, i, :n])[None])[0][0]  # (n, H)
            s, a = _pool(enc.word_attention, h)
            vectors.append(s)
            word_w[b, i, :n] = a
        hs = enc.sentence_encoder.gru(torch.stack(vectors)[None])[0][0]
        v, a = _pool(enc.sentence_attention, hs)
        sent_w[b, :len(vectors)] = a
        logits[b] = m.classifier.weight @ v + m.classifier.bias  # eq. 11 before the softmax
    return logits, sent_w, word_w


def test_matches_hand_computation():
    m = _model()
    out = m(IDS)
    for got, ref in zip(out, _reference(m, IDS, [3, 2]), strict=True):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)


def test_sentence_lengths_drop_the_later_sentences():
    m = _model()
    out = m(IDS, sentence_lengths=torch.tensor([2, 1]))
    for got, ref in zip(out, _reference(m, IDS, [2, 1]), strict=True):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    assert out.word_weights[0, 2].eq(0).all() and out.sentence_weights[1, 1:].eq(0).all()


def test_padding_never_changes_outputs_and_documents_are_independent():
    m = _model()
    out = m(IDS)
    word_mask = IDS != PAD
    noisy = torch.where(word_mask, IDS, torch.randint(1, VOCAB, IDS.shape, generator=torch.Generator().manual_seed(1)))
    torch.testing.assert_close(m(noisy, word_mask=word_mask), out, rtol=0, atol=0)
    alone = m(IDS[1:, :2, :4])
    torch.testing.assert_close(alone.logits, out.logits[1:], rtol=0, atol=1e-12)
    torch.testing.assert_close(out.word_weights.sum(-1), word_mask.any(-1).double())
    torch.testing.assert_close(out.sentence_weights.sum(-1), torch.ones(B, dtype=torch.float64))


def test_document_without_sentences_is_the_classifier_bias():
    m = _model()
    out = m(IDS, sentence_lengths=torch.tensor([3, 0]))
    torch.testing.assert_close(out.logits[1], m.classifier.bias, rtol=0, atol=0)
    assert out.sentence_weights[1].eq(0).all() and out.word_weights[1].eq(0).all()
    empty = m(IDS[:, :0])  # no sentence slot at all: the same v = 0 (was a reshape RuntimeError)
    torch.testing.assert_close(empty.logits, m.classifier.bias.expand(2, -1), rtol=0, atol=0)
    assert empty.sentence_weights.shape == (2, 0) and empty.word_weights.shape == (2, 0, IDS.shape[2])
    none = m(IDS[:0])  # an empty batch
    assert none.logits.shape == (0, C) and none.word_weights.shape == (0, *IDS.shape[1:])


def test_overfits_a_single_batch():
    torch.manual_seed(0)
    m = HierarchicalAttentionNetwork(VOCAB, C, embed_dim=8, hidden_dim=16, padding_idx=PAD)
    ids = torch.randint(1, VOCAB, (6, S, W), generator=torch.Generator().manual_seed(4))
    labels = torch.tensor([0, 1, 2, 3, 1, 2])
    opt = torch.optim.Adam(m.parameters(), lr=0.03)
    for _ in range(40):
        opt.zero_grad()
        loss = F.cross_entropy(m(ids).logits, labels)
        loss.backward()
        opt.step()
    assert loss < 0.05
    assert torch.equal(m(ids).logits.argmax(-1), labels)


def test_bad_arguments_raise_attnkit_errors():
    m = _model()
    with pytest.raises(ShapeError, match="ids"):
        m(IDS[0])
    with pytest.raises(DTypeError, match="ids"):
        m(IDS.double())
    with pytest.raises(ArgumentError, match=r"ids must lie in \[0, 17\)"):
        m(IDS + VOCAB)
    with pytest.raises(DTypeError, match="word_mask"):
        m(IDS, word_mask=(IDS != PAD).long())
    with pytest.raises(ShapeError, match="word_mask"):
        m(IDS, word_mask=(IDS != PAD)[:, :, :3])
    with pytest.raises(ArgumentError, match="sentence_lengths"):
        m(IDS, sentence_lengths=torch.tensor([4, 1]))
    with pytest.raises(DTypeError, match=r"sentence_lengths.*float32"):  # the dtype is wrong, not the shape
        m(IDS, sentence_lengths=torch.tensor([1.0, 2.0]))
    with pytest.raises(ShapeError, match=r"sentence_lengths must have shape \(batch,\) = \(2,\)"):
        m(IDS, sentence_lengths=torch.tensor([1, 2, 1]))
    with pytest.raises(ArgumentError, match="padding_idx"):
        HierarchicalAttentionNetwork(VOCAB, C, padding_idx=VOCAB)
    with pytest.raises(ArgumentError, match="left-aligned"):
        m(IDS, word_mask=IDS == PAD)
