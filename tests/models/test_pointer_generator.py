"""PointerGenerator (See et al. 2017) against a float64 transcription of eqs. 1-12, p_gen limits, masks, training."""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.models.pointer_generator import PointerGenerator

B, S, T, V, E, H, OOV = 2, 7, 5, 11, 6, 8, 3
SRC = torch.tensor([[4, 1, 7, 1, 2, 9, 1], [3, 5, 6, 1, 0, 0, 0]])  # 1 = UNK; sample 1 has 4 real tokens
EXT = torch.tensor([[4, 11, 7, 12, 2, 9, 13], [3, 5, 6, 11, 0, 0, 0]])  # source OOVs numbered from V
TGT_IN = torch.tensor([[2, 11, 7, 13, 12], [2, 11, 3, 5, 6]])  # extended ids are fed as UNK
LENGTHS = torch.tensor([S, 4])


def _model(coverage=True, seed=0):
    torch.manual_seed(seed)
    m = PointerGenerator(V, embed_dim=E, hidden_dim=H, attn_dim=5, coverage=coverage).double()
    if coverage:
        with torch.no_grad():
            m.attention.w_c.mul_(3.0)  # make the coverage feature matter
    return m


@torch.no_grad()
def _reference(m, coverage):
    """Per sample, unpadded; LSTMs by torch, eqs. 1/11, 2, 4, 8, 9, 12 by hand. Returns dict of (B, T, ...) tensors."""
    p_vocab = torch.zeros(B, T, V, dtype=torch.float64)
    copy = torch.zeros(B, T, V + OOV, dtype=torch.float64)
    attn = torch.zeros(B, T, S, dtype=torch.float64)
    p_gen = torch.zeros(B, T, dtype=torch.float64)
    cov_loss = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        n = int(LENGTHS[b])
        hs, (hn, cn) = m.encoder(m.embed(SRC[b, :n])[None])
        hs = hs[0]
        init = (torch.cat([hn[0], hn[1]], -1)[None], torch.cat([cn[0], cn[1]], -1)[None])
        x = m.embed(torch.where(TGT_IN[b] >= V, 1, TGT_IN[b]))  # (T, E)
        st = m.decoder(x[None], init)[0][0]  # (T, H)
        c = torch.zeros(n, dtype=torch.float64)
        for t in range(T):
            if coverage:
                at = m.attention
                e = torch.stack([at.v @ torch.tanh(at.w_h.weight @ hs[i] + at.w_s.weight @ st[t] + at.w_c * c[i]
                                                   + at.w_s.bias) for i in range(n)])
            else:
                at = m.attention
                e = torch.stack([at.v @ torch.tanh(at.query_proj.weight @ st[t] + at.query_proj.bias
                                                   + at.key_proj.weight @ hs[i]) for i in range(n)])
            a = torch.exp(e - e.max()) / torch.exp(e - e.max()).sum()
            ctx = sum(a[i] * hs[i] for i in range(n))
            logits = m.vocab_out.weight @ (m.vocab_hidden.weight @ torch.cat([st[t], ctx]) + m.vocab_hidden.bias) \
                + m.vocab_out.bias
            p_vocab[b, t] = (torch.exp(logits - logits.max()) / torch.exp(logits - logits.max()).sum()).detach()
            z = m.switch.weight[0] @ torch.cat([ctx, st[t], x[t]]) + m.switch.bias[0]
            p_gen[b, t] = 1 / (1 + torch.exp(-z.detach()))  # eq. 8: exactly 0 or 1 when saturated
            for i in range(n):
                copy[b, t, EXT[b, i]] += float(a[i])
            attn[b, t, :n] = a.detach()
            cov_loss[b, t] = sum(min(float(a[i]), float(c[i])) for i in range(n))
            c = c + a.detach()
    final = p_gen[..., None] * torch.cat([p_vocab, torch.zeros(B, T, OOV, dtype=torch.float64)], -1) \
        + (1 - p_gen[..., None]) * copy
    return {"p_vocab": p_vocab, "copy": copy, "attention": attn, "p_gen": p_gen, "coverage_loss": cov_loss,
            "final": final}


def _run(m):
    return m(SRC, TGT_IN, src_lengths=LENGTHS, src_ext_ids=EXT, num_oov=OOV)


@pytest.mark.parametrize("coverage", [True, False])
def test_matches_paper_equations(coverage):
    m = _model(coverage)
    out, ref = _run(m), _reference(m, coverage)
    for name in ("attention", "p_gen", "coverage_loss"):
        torch.testing.assert_close(getattr(out, name), ref[name], rtol=0, atol=1e-12)
    torch.testing.assert_close(out.log_probs.exp(), ref["final"], rtol=0, atol=1e-12)
    assert torch.equal(out.log_probs.isinf(), ref["final"] == 0)  # P(w) = 0 exactly <=> -inf
    assert out.log_probs[1, :, 12:].isinf().all()  # sample 1 has only one OOV (11) to copy
    torch.testing.assert_close(out.log_probs.exp().sum(-1), torch.ones(B, T, dtype=torch.float64))


@pytest.mark.parametrize("p_gen", [1.0, 0.0])
def test_p_gen_limits_are_the_generator_and_the_copy_distribution(p_gen):
    m = _model()
    with torch.no_grad():
        m.switch.weight.zero_()
        m.switch.bias.fill_(1000.0 if p_gen else -1000.0)  # sigmoid saturates to exactly 1 / 0 in float64
    out, ref = _run(m), _reference(m, True)
    assert out.p_gen.eq(p_gen).all()
    if p_gen:  # the plain attention decoder: softmax over the fixed vocabulary, nothing for source OOVs
        torch.testing.assert_close(out.log_probs[..., :V], ref["p_vocab"].log(), rtol=0, atol=1e-12)
        assert out.log_probs[..., V:].eq(float("-inf")).all()
    else:  # the attention scattered over the source ids
        torch.testing.assert_close(out.log_probs.exp(), ref["copy"], rtol=0, atol=1e-12)
        assert out.log_probs[1, :, 2].eq(float("-inf")).all()  # id 2 is not in sample 1's source


def test_source_padding_never_changes_valid_outputs():
    m = _model()
    out = _run(m)
    src, ext = SRC.clone(), EXT.clone()
    src[1, 4:], ext[1, 4:] = torch.tensor([8, 9, 10]), torch.tensor([13, 12, 2])
    torch.testing.assert_close(m(src, TGT_IN, src_lengths=LENGTHS, src_ext_ids=ext, num_oov=OOV), out,
                               rtol=0, atol=0)
    alone = m(SRC[1:, :4], TGT_IN[1:], src_ext_ids=EXT[1:, :4], num_oov=OOV)
    torch.testing.assert_close(alone.log_probs, out.log_probs[1:], rtol=0, atol=1e-12)
    assert out.attention[1, :, 4:].eq(0).all()


def test_loss_is_eq_13_and_its_gradient_is_finite_despite_zero_probabilities():
    m = _model()
    out = _run(m)
    target = torch.tensor([[11, 7, 13, 12, 3], [11, 3, 5, 6, 2]])
    keep = torch.arange(T) < torch.tensor([[T], [4]])
    nll = -out.log_probs.gather(-1, target[..., None])[..., 0]
    expected = (nll + 0.7 * out.coverage_loss)[keep].mean()
    loss = PointerGenerator.loss(out, target, mask=keep, coverage_weight=0.7)
    torch.testing.assert_close(loss, expected)
    assert out.log_probs.isinf().any()
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


def test_overfits_copying_source_oovs():
    torch.manual_seed(0)
    m = PointerGenerator(V, embed_dim=16, hidden_dim=16)
    target = EXT[:, [0, 1, 2, 3, 1]]  # copy source words, OOVs included
    tgt_in = torch.cat([torch.full((B, 1), 2), target[:, :-1]], 1)
    opt = torch.optim.Adam(m.parameters(), lr=0.03)
    for _ in range(60):
        opt.zero_grad()
        out = m(SRC, tgt_in, src_lengths=LENGTHS, src_ext_ids=EXT, num_oov=OOV)
        loss = PointerGenerator.loss(out, target, coverage_weight=0.0)
        loss.backward()
        opt.step()
    assert loss < 0.05
    assert torch.equal(out.log_probs.argmax(-1), target)


def test_bad_arguments_raise_attnkit_errors():
    m = _model()
    with pytest.raises(ArgumentError, match=r"src_ext_ids ids must lie in \[0, 14\)"):
        m(SRC, TGT_IN, src_ext_ids=EXT + 1, num_oov=OOV)
    with pytest.raises(ShapeError, match="src_ext_ids"):
        m(SRC, TGT_IN, src_ext_ids=EXT[:, :4], num_oov=OOV)
    with pytest.raises(ArgumentError, match="tgt_in"):
        m(SRC, TGT_IN, num_oov=1)
    with pytest.raises(ArgumentError, match="num_oov"):
        m(SRC, TGT_IN, num_oov=-1)
    with pytest.raises(ArgumentError, match="src ids"):
        m(EXT, TGT_IN, num_oov=OOV)
    with pytest.raises(DTypeError, match="src"):
        m(SRC.float(), TGT_IN, num_oov=OOV)
    with pytest.raises(ArgumentError, match="unk_id"):
        PointerGenerator(V, unk_id=V)


def test_extended_ids_must_match_the_source():
    """``src_ext_ids`` names the same source words as ``src`` (OOVs on UNK); a mismatch used to be used silently,
    copying a word the encoder never read."""
    m = _model(True)
    for b, i, value in ((0, 0, 5), (0, 0, V), (1, 3, 6)):  # another in-vocab word; an OOV id over a real word
        ext = EXT.clone()
        ext[b, i] = value
        with pytest.raises(ArgumentError, match=rf"src\[{b}, {i}\] = {int(SRC[b, i])}, src_ext_ids\[{b}, {i}\]"):
            m(SRC, TGT_IN, src_lengths=LENGTHS, src_ext_ids=ext, num_oov=OOV)
    padded = EXT.clone()
    padded[1, 5] = V + 1  # beyond sample 1's length: not a source word, not checked
    torch.testing.assert_close(m(SRC, TGT_IN, src_lengths=LENGTHS, src_ext_ids=padded, num_oov=OOV).log_probs,
                               m(SRC, TGT_IN, src_lengths=LENGTHS, src_ext_ids=EXT, num_oov=OOV).log_probs)
