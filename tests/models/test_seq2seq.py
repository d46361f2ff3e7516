"""Seq2Seq (Bahdanau et al. 2015 / Luong et al. 2015) against float64 hand computations, masks, decoding, training."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.models.seq2seq import Seq2Seq
from attnkit.nn.additive import AdditiveAttention

B, S, T, SV, TV, E, H = 2, 7, 5, 11, 13, 6, 8
NAMES = ("additive", "luong-dot", "luong-general", "luong-concat", "local-m", "local-p", "coverage", "hard")


def _model(attention="additive", rnn="gru", seed=0, **kwargs):
    torch.manual_seed(seed)
    return Seq2Seq(SV, TV, embed_dim=E, hidden_dim=H, rnn=rnn, attention=attention, **kwargs).double()


def _data(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, SV, (B, S), generator=g), torch.randint(0, TV, (B, T), generator=g)


# ------------------------------------------------------------ float64 reference: Luong eqs. 5-8 with the paper's scores

def _reference(m, src, tgt_in, lengths, score):
    """Per sample: unpadded encoder and decoder (torch RNNs), then scores, softmax, context, h~, logits by hand."""
    logits = torch.zeros(B, T, TV, dtype=torch.float64)
    weights = torch.zeros(B, T, S, dtype=torch.float64)
    for b in range(B):
        n = int(lengths[b])
        hs, hn = m.encoder(m.src_embed(src[b, :n])[None])
        hs = hs[0].detach()  # (n, H)
        init = torch.cat([hn[0], hn[1]], -1)[None]  # (1, 1, H): [forward final; backward final]
        ht = m.decoder(m.tgt_embed(tgt_in[b])[None], init)[0][0].detach()  # (T, H)
        for t in range(T):
            if score == "additive":
                wq, wk, v = m.attention.query_proj.weight, m.attention.key_proj.weight, m.attention.v
                e = torch.stack([v @ torch.tanh(wq @ ht[t] + wk @ hs[s]) for s in range(n)])
                wc = m.combine.weight
            else:  # Luong "general": h_t^T W_a h_s
                e = torch.stack([ht[t] @ m.attention.w_a @ hs[s] for s in range(n)])
                wc = m.attention.w_c.weight
            a = torch.exp(e - e.max()) / torch.exp(e - e.max()).sum()
            c = sum(a[s] * hs[s] for s in range(n))
            tilde = torch.tanh(wc @ torch.cat([c, ht[t]]))
            logits[b, t] = (m.out.weight @ tilde + m.out.bias).detach()
            weights[b, t, :n] = a.detach()
    return logits, weights


@pytest.mark.parametrize("score", ["additive", "luong-general"])
def test_matches_hand_computation_with_padding(score):
    m = _model(score)
    src, tgt_in = _data()
    lengths = torch.tensor([S, 4])
    out = m(src, tgt_in, src_lengths=lengths)
    ref_logits, ref_weights = _reference(m, src, tgt_in, lengths, score)
    torch.testing.assert_close(out.logits, ref_logits, rtol=0, atol=1e-12)
    torch.testing.assert_close(out.weights, ref_weights, rtol=0, atol=1e-12)


@pytest.mark.parametrize("rnn", ["gru", "lstm"])
@pytest.mark.parametrize("name", NAMES)
def test_shapes_and_weights_every_attention(name, rnn):
    m = _model(name, rnn)
    src, tgt_in = _data()
    out = m(src, tgt_in, src_mask=torch.arange(S) < torch.tensor([[S], [3]]))
    assert out.logits.shape == (B, T, TV) and out.weights.shape == (B, T, S)
    assert out.weights[1, :, 3:].eq(0).all()
    sums = out.weights.sum(-1)
    if name == "local-p":  # Gaussian-scaled, not renormalised (Luong eq. 10)
        assert (sums > 0).all() and (sums <= 1 + 1e-12).all()
    else:
        torch.testing.assert_close(sums, torch.ones(B, T, dtype=torch.float64))
    assert (out.coverage_loss is not None) == (name == "coverage")
    if name == "coverage":  # See et al. eq. 12 from the returned weights
        before = out.weights.cumsum(1) - out.weights
        torch.testing.assert_close(out.coverage_loss, torch.minimum(out.weights, before).sum(-1))


@pytest.mark.parametrize("name", NAMES)
def test_source_padding_never_changes_valid_outputs(name):
    m = _model(name)
    src, tgt_in = _data()
    lengths = torch.tensor([S, 4])
    out = m(src, tgt_in, src_lengths=lengths)
    noisy = src.clone()
    noisy[1, 4:] = torch.tensor([0, 10, 3])
    torch.testing.assert_close(m(noisy, tgt_in, src_lengths=lengths), out, rtol=0, atol=0)
    alone = m(src[1:, :4], tgt_in[1:])  # the padded sample alone, unpadded: same result
    torch.testing.assert_close(alone.logits, out.logits[1:], rtol=0, atol=1e-12)
    torch.testing.assert_close(alone.weights, out.weights[1:, :, :4], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_decode_equals_teacher_forced_argmax(name):
    m = _model(name, rnn="lstm" if name in ("coverage", "local-m") else "gru")
    src, _ = _data()
    lengths = torch.tensor([S, 5])
    dec = m.greedy_decode(src, src_lengths=lengths, max_len=6, bos=1)
    assert dec.ids.shape == (B, 6) and dec.weights.shape == (B, 6, S) and dec.lengths.tolist() == [6, 6]
    tgt_in = torch.cat([torch.ones(B, 1, dtype=torch.long), dec.ids[:, :-1]], 1)
    out = m(src, tgt_in, src_lengths=lengths)
    assert torch.equal(out.logits.argmax(-1), dec.ids)
    torch.testing.assert_close(out.weights, dec.weights, rtol=0, atol=1e-12)


def test_greedy_decode_stops_at_eos():
    m = _model("additive")
    src, _ = _data()
    free = m.greedy_decode(src, max_len=6, bos=1)
    eos = int(free.ids[0, 2])
    dec = m.greedy_decode(src, max_len=6, bos=1, eos=eos)
    stop = int((free.ids[0] == eos).int().argmax())  # first eos in sample 0
    assert dec.lengths[0] == stop + 1
    assert torch.equal(dec.ids[0, :stop + 1], free.ids[0, :stop + 1])
    assert dec.ids[0, stop:].eq(eos).all() and dec.weights[0, stop + 1:].eq(0).all()
    assert m.greedy_decode(src, max_len=0, bos=1).ids.shape == (B, 0)


def test_module_instance_and_factory_equal_the_named_attention():
    src, tgt_in = _data()
    named = _model("additive")
    torch.manual_seed(5)
    custom = Seq2Seq(SV, TV, embed_dim=E, hidden_dim=H, attention=AdditiveAttention(H)).double()
    factory = Seq2Seq(SV, TV, embed_dim=E, hidden_dim=H, attention=lambda q, k: AdditiveAttention(q, k)).double()
    for other in (custom, factory):
        other.load_state_dict(named.state_dict())
        torch.testing.assert_close(other(src, tgt_in), named(src, tgt_in), rtol=0, atol=0)


def test_empty_source_sample_gets_zero_context():
    m = _model("luong-general")
    src, tgt_in = _data()
    out = m(src, tgt_in, src_lengths=torch.tensor([S, 0]))
    assert torch.isfinite(out.logits).all() and out.weights[1].eq(0).all()
    out.logits.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


def _copy_batch():
    g = torch.Generator().manual_seed(3)
    src = torch.randint(2, SV, (4, 6), generator=g)
    tgt = src.flip(1)  # reverse the source: needs the alignment
    return src, torch.cat([torch.ones(4, 1, dtype=torch.long), tgt[:, :-1]], 1), tgt


@pytest.mark.parametrize("name", ["additive", "luong-general", "coverage"])
def test_overfits_a_single_batch(name):
    torch.manual_seed(0)
    m = Seq2Seq(SV, TV, embed_dim=16, hidden_dim=24, attention=name)
    src, tgt_in, tgt = _copy_batch()
    opt = torch.optim.Adam(m.parameters(), lr=0.03)
    for _ in range(50):
        opt.zero_grad()
        loss = Seq2Seq.loss(m(src, tgt_in), tgt, coverage_weight=0.1)
        loss.backward()
        opt.step()
    out = m(src, tgt_in)
    assert F.cross_entropy(out.logits.transpose(1, 2), tgt) < 0.05
    assert torch.equal(m.greedy_decode(src, max_len=6, bos=1).ids, tgt)


def test_loss_mask_ignores_padded_targets():
    m = _model("coverage")
    src, tgt_in = _data()
    out = m(src, tgt_in)
    target = tgt_in.roll(-1, 1)
    keep = torch.arange(T) < torch.tensor([[T], [2]])
    per = F.cross_entropy(out.logits.transpose(1, 2), target, reduction="none") + 0.5 * out.coverage_loss
    torch.testing.assert_close(Seq2Seq.loss(out, target, mask=keep, coverage_weight=0.5), per[keep].mean())


def test_bad_arguments_raise_attnkit_errors():
    src, tgt_in = _data()
    m = _model()
    with pytest.raises(ArgumentError, match="attention"):
        Seq2Seq(SV, TV, attention="bahdanau")
    with pytest.raises(ArgumentError, match="attention"):
        Seq2Seq(SV, TV, attention=lambda q, k: "not a module")
    with pytest.raises(ArgumentError, match="rnn"):
        Seq2Seq(SV, TV, rnn="rnn")
    with pytest.raises(ArgumentError, match="even"):
        Seq2Seq(SV, TV, hidden_dim=7)
    with pytest.raises(DTypeError, match="src"):
        m(src.double(), tgt_in)
    with pytest.raises(ArgumentError, match=r"tgt_in ids must lie in \[0, 13\)"):
        m(src, tgt_in + TV)
    with pytest.raises(ShapeError, match="tgt_in"):
        m(src, tgt_in[:1])
    with pytest.raises(ArgumentError, match="not both"):
        m(src, tgt_in, src_lengths=torch.tensor([1, 2]), src_mask=torch.ones(B, S, dtype=torch.bool))
    with pytest.raises(ArgumentError, match="left-aligned"):
        m(src, tgt_in, src_mask=torch.arange(S).expand(B, S) > 2)
    with pytest.raises(ShapeError, match=r"\(2, 7\)"):
        m(src, tgt_in, src_mask=torch.ones(S, B, dtype=torch.bool))
    with pytest.raises(ArgumentError, match="lengths"):
        m(src, tgt_in, src_lengths=torch.tensor([8, 1]))
    with pytest.raises(ArgumentError, match="bos"):
        m.greedy_decode(src, max_len=3, bos=TV)
    with pytest.raises(ArgumentError, match="max_len"):
        m.greedy_decode(src, max_len=-1, bos=1)
