"""AttentionPooling and HierarchicalAttention against float64 loop transcriptions of Yang et al. 2016."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.autograd import gradcheck

from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.nn.pooling import AttentionPooling, HierarchicalAttention
from attnkit.registry import get


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _lengths_mask(lengths, width):
    return torch.arange(width) < torch.tensor(lengths)[..., None]


# ---------------------------------------------------------------- references: eqs. 5-7 and 8-10, one position at a time

def ref_pool(pool, h, keep):
    """u_t = tanh(W h_t + b); a_t = exp(u_t . u_w) / sum over kept t; s = sum_t a_t h_t. h (n, D), keep (n,)."""
    w, b, uw = (t.detach().double() for t in (pool.proj.weight, pool.proj.bias, pool.context))
    h = h.detach()
    n = h.shape[0]
    scores = [sum(math.tanh(float(w[a] @ h[t] + b[a])) * float(uw[a]) for a in range(w.shape[0])) for t in range(n)]
    kept = [t for t in range(n) if keep[t]]
    weights = torch.zeros(n, dtype=torch.float64)
    if kept:
        top = max(scores[t] for t in kept)
        total = sum(math.exp(scores[t] - top) for t in kept)
        for t in kept:
            weights[t] = math.exp(scores[t] - top) / total
    pooled = sum((weights[t] * h[t] for t in range(n)), torch.zeros(h.shape[1], dtype=torch.float64))
    return pooled, weights


def ref_encode(encoder, xs):
    """The paper's BiGRU run on one unpadded sentence (1, L, D); identity when encoder is None."""
    if encoder is None:
        return xs
    if xs.shape[0] == 0:
        return xs.new_zeros(0, encoder.output_dim)
    return encoder.gru(xs[None])[0][0]


def ref_han(han, x, word_lengths):
    """Loop over documents and sentences; padding is never fed to the encoders."""
    b, s, w, _ = x.shape
    docs, word_w, sent_w = [], torch.zeros(b, s, w, dtype=torch.float64), torch.zeros(b, s, dtype=torch.float64)
    for i in range(b):
        sent_vecs, real = [], []
        for j in range(s):
            n = word_lengths[i][j]
            h = ref_encode(han.word_encoder, x[i, j, :n])
            vec, a = ref_pool(han.word_attention, h, [True] * n) if n else (None, None)
            if n:
                word_w[i, j, :n] = a
                sent_vecs.append(vec)
                real.append(j)
        hs = ref_encode(han.sentence_encoder, torch.stack(sent_vecs)) if sent_vecs else None
        if hs is None:
            docs.append(torch.zeros(han.output_dim, dtype=torch.float64))
            continue
        doc, a = ref_pool(han.sentence_attention, hs, [True] * len(real))
        sent_w[i, real] = a
        docs.append(doc)
    return torch.stack(docs), word_w, sent_w


# ---------------------------------------------------------------- AttentionPooling

def test_pooling_matches_equations_with_mask():
    torch.manual_seed(0)
    pool = AttentionPooling(11, 7).double()
    x = _randn(2, 5, 11)
    keep = _lengths_mask([5, 3], 5)
    pooled, weights = pool(x, mask=keep)
    for i in range(2):
        ref_p, ref_w = ref_pool(pool, x[i], keep[i])
        torch.testing.assert_close(pooled[i], ref_p, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(weights[i], ref_w, rtol=1e-10, atol=1e-12)
    assert torch.equal(weights[1, 3:], torch.zeros(2, dtype=torch.float64))


def test_pooling_zero_context_is_the_mean():
    pool = AttentionPooling(11, 7).double()
    with torch.no_grad():
        pool.context.zero_()
    x = _randn(2, 5, 11)
    pooled, _ = pool(x, mask=_lengths_mask([5, 2], 5))
    torch.testing.assert_close(pooled[0], x[0].mean(0))
    torch.testing.assert_close(pooled[1], x[1, :2].mean(0))


def test_pooling_fully_masked_row_is_zero_with_finite_grads():
    pool = AttentionPooling(11, 7).double()
    x = _randn(2, 5, 11).requires_grad_()
    keep = _lengths_mask([4, 0], 5)
    pooled, weights = pool(x, mask=keep)
    assert torch.equal(pooled[1], torch.zeros(11, dtype=torch.float64))
    assert torch.equal(weights[1], torch.zeros(5, dtype=torch.float64))
    pooled.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.equal(x.grad[1], torch.zeros(5, 11, dtype=torch.float64))
    assert all(torch.isfinite(p.grad).all() for p in pool.parameters())


def test_pooling_float32_close_to_float64():
    torch.manual_seed(1)
    pool = AttentionPooling(11, 7)
    x = _randn(2, 5, 11)
    got, _ = pool(x.float())
    ref, _ = pool.double()(x)
    torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=3), st.integers(0, 1000))
def test_pooling_weights_sum_to_one_and_masked_get_zero(lengths, seed):
    pool = AttentionPooling(4, 3).double()
    x = _randn(len(lengths), 6, 4, seed=seed)
    keep = _lengths_mask(lengths, 6)
    _, weights = pool(x, mask=keep)
    torch.testing.assert_close(weights.sum(-1), torch.ones(len(lengths), dtype=torch.float64))
    assert (weights[~keep] == 0).all()


def test_pooling_gradcheck():
    pool = AttentionPooling(4, 3).double()
    keep = _lengths_mask([3, 2], 3)
    assert gradcheck(lambda x: pool(x, mask=keep).pooled, (_randn(2, 3, 4).requires_grad_(),))


def test_pooling_bad_inputs():
    pool = AttentionPooling(4)
    with pytest.raises(ShapeError, match=r"x must have shape \(batch, length, 4\)"):
        pool(torch.randn(2, 3, 5))
    with pytest.raises(DTypeError, match="mask must be a bool"):
        pool(torch.randn(2, 3, 4), mask=torch.ones(2, 3))
    with pytest.raises(ShapeError, match=r"mask must have shape \(2, 3\)"):
        pool(torch.randn(2, 3, 4), mask=torch.ones(3, 2, dtype=torch.bool))


# ---------------------------------------------------------------- HierarchicalAttention

WORD_LENGTHS = [[3, 1, 4], [2, 0, 0]]  # the second document has one sentence, then two empty ones


def _han_inputs(seed=0):
    x = _randn(2, 3, 4, 5, seed=seed)
    return x, _lengths_mask(WORD_LENGTHS, 4)


@pytest.mark.parametrize("encoders", [("gru", "gru"), ("identity", "identity"), ("gru", "identity")])
def test_han_matches_per_sentence_reference(encoders):
    torch.manual_seed(0)
    han = HierarchicalAttention(5, 6, attn_dim=7, word_encoder=encoders[0], sentence_encoder=encoders[1]).double()
    x, word_mask = _han_inputs()
    doc, word_w, sent_w = han(x, word_mask=word_mask)
    ref_doc, ref_word_w, ref_sent_w = ref_han(han, x, WORD_LENGTHS)
    torch.testing.assert_close(doc, ref_doc, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(word_w, ref_word_w, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(sent_w, ref_sent_w, rtol=1e-9, atol=1e-11)


def test_han_padding_cannot_leak():
    torch.manual_seed(0)
    for enc in ("gru", "identity"):
        han = HierarchicalAttention(5, 6, word_encoder=enc, sentence_encoder=enc).double()
        x, word_mask = _han_inputs()
        dirty = x.masked_fill(~word_mask[..., None], float("nan"))
        clean = han(x, word_mask=word_mask)
        got = han(dirty, word_mask=word_mask)
        for a, b in zip(got, clean, strict=True):
            assert torch.equal(a, b)


def test_han_empty_document_is_zero_with_finite_grads():
    han = HierarchicalAttention(5, 6).double()
    x = _randn(2, 3, 4, 5).requires_grad_()
    word_mask = _lengths_mask([[2, 4, 1], [0, 0, 0]], 4)
    doc, word_w, sent_w = han(x, word_mask=word_mask)
    assert torch.equal(doc[1], torch.zeros(6, dtype=torch.float64))
    assert not word_w[1].any() and not sent_w[1].any()
    doc.sum().backward()
    assert torch.isfinite(x.grad).all() and not x.grad[1].any()


def test_han_sentence_mask_drops_a_sentence():
    han = HierarchicalAttention(5, 6, word_encoder="identity", sentence_encoder="identity").double()
    x, word_mask = _han_inputs()
    sentence_mask = torch.tensor([[True, False, True], [True, False, False]])
    doc, _, sent_w = han(x, word_mask=word_mask, sentence_mask=sentence_mask)
    assert sent_w[0, 1] == 0
    kept = han(x[:, [0, 2]], word_mask=word_mask[:, [0, 2]]).document
    torch.testing.assert_close(doc[0], kept[0])


def test_han_batch_slicing_invariance():
    han = HierarchicalAttention(5, 6).double()
    x, word_mask = _han_inputs()
    full = han(x, word_mask=word_mask)
    alone = han(x[:1], word_mask=word_mask[:1])
    for a, b in zip(full, alone, strict=True):
        torch.testing.assert_close(a[:1], b, rtol=1e-12, atol=1e-14)


def test_han_custom_encoder_module():
    torch.manual_seed(0)
    word_enc, sent_enc = nn.Linear(5, 6).double(), nn.Linear(6, 6).double()
    han = HierarchicalAttention(5, 6, word_encoder=word_enc, sentence_encoder=sent_enc).double()
    x, word_mask = _han_inputs()
    doc, _, _ = han(x, word_mask=word_mask)
    # Reference: the same pipeline written out, with the custom encoders applied to the unpadded rows.
    sent_vec = torch.stack([torch.stack([
        ref_pool(han.word_attention, word_enc(x[i, j, :n]), [True] * n)[0] if n else torch.zeros(6, dtype=torch.float64)
        for j, n in enumerate(row)]) for i, row in enumerate(WORD_LENGTHS)])
    for i, row in enumerate(WORD_LENGTHS):
        real = [j for j, n in enumerate(row) if n]
        ref_doc, _ = ref_pool(han.sentence_attention, sent_enc(sent_vec[i, real]), [True] * len(real))
        torch.testing.assert_close(doc[i], ref_doc, rtol=1e-9, atol=1e-11)


def test_han_gradcheck():
    torch.manual_seed(0)
    han = HierarchicalAttention(3, 4, attn_dim=2).double()
    word_mask = _lengths_mask([[2, 3], [1, 0]], 3)
    x = _randn(2, 2, 3, 3).requires_grad_()
    assert gradcheck(lambda t: han(t, word_mask=word_mask).document, (x,))


def test_han_state_dict_round_trip():
    torch.manual_seed(0)
    a = HierarchicalAttention(5, 6).double()
    torch.manual_seed(1)
    b = HierarchicalAttention(5, 6).double()
    x, word_mask = _han_inputs()
    assert not torch.allclose(a(x, word_mask=word_mask).document, b(x, word_mask=word_mask).document)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(x, word_mask=word_mask).document, b(x, word_mask=word_mask).document)
    assert set(a.state_dict()) >= {"word_attention.context", "sentence_attention.proj.weight"}


def test_han_bad_inputs():
    han = HierarchicalAttention(5, 6)
    with pytest.raises(ShapeError, match=r"x must have shape \(batch, sentences, words, 5\)"):
        han(torch.randn(2, 4, 5))
    holes = torch.tensor([[[True, False, True, False]] * 3] * 2)
    with pytest.raises(ArgumentError, match="word_mask must be left-aligned"):
        han(torch.randn(2, 3, 4, 5), word_mask=holes)
    with pytest.raises(ArgumentError, match="hidden_dim must be even"):
        HierarchicalAttention(5, 7)
    with pytest.raises(ArgumentError, match="encoder must be"):
        HierarchicalAttention(5, 6, word_encoder="lstm")


def test_registry_examples_run():
    for name, shape in (("attention-pooling", (2, 8)), ("hierarchical-attention", (2, 6))):
        module, inputs = get(name).example()
        assert module(*inputs)[0].shape == shape


def test_hierarchical_empty_batch_and_zero_sentences_give_empty_outputs():
    model = HierarchicalAttention(4, 6)
    width = model(torch.randn(1, 2, 3, 4)).document.shape[-1]
    for shape in ((0, 3, 5, 4), (2, 0, 5, 4)):
        out = model(torch.randn(*shape))
        assert out.document.shape == (shape[0], width) and out.word_weights.shape == shape[:3]
