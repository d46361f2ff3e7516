"""Transformer encoder/decoder stacks, the encoder-decoder Transformer and TransformerLM."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch import nn

from attnkit import masks
from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.models import Transformer, TransformerDecoder, TransformerEncoder, TransformerLM
from attnkit.models.self_attention import MECHANISMS, SoftmaxSelfAttention
from attnkit.nn import LocalAttention
from attnkit.nn.multihead import MultiHeadAttention

B, N, M, DIM, H, FF, V = 2, 5, 7, 12, 3, 20, 11  # distinct sizes; head width 4


def randomize(module: nn.Module, seed: int = 0, std: float = 0.3) -> nn.Module:
    """Every parameter random (zero-initialised biases and unit LayerNorm weights would hide mistakes)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * std + (1.0 if p.dim() == 1 else 0.0))
    return module


def features(*shape, seed=1, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


# ------------------------------------------------------------- float64 transcription of the paper's equations
def ref_layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def ref_mha(x, attn, allowed):
    """Sec. 3.2.2 with explicit loops over heads and queries; ``allowed[i, j]`` True = query i may see key j."""
    e = x.shape[-1]
    d = e // H
    w, bias = attn.in_proj_weight.double(), attn.in_proj_bias.double()
    q, k, v = (x @ w[i * e:(i + 1) * e].T + bias[i * e:(i + 1) * e] for i in range(3))
    heads = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for h in range(H):
            cols = slice(h * d, (h + 1) * d)
            for i in range(x.shape[1]):
                keys = [j for j in range(x.shape[1]) if allowed[i, j]]
                scores = torch.stack([q[b, i, cols] @ k[b, j, cols] for j in keys]) / math.sqrt(d)
                weights = torch.exp(scores - scores.max()) / torch.exp(scores - scores.max()).sum()
                heads[b, i, cols] = sum(wt * v[b, j, cols] for wt, j in zip(weights, keys, strict=True))
    return heads @ attn.out_proj.weight.double().T + attn.out_proj.bias.double()


def ref_encoder_layer(x, layer, allowed, norm_first):
    ffn = lambda y: torch.relu(y @ layer.linear1.weight.T + layer.linear1.bias) @ layer.linear2.weight.T \
        + layer.linear2.bias  # eq. 2
    ln1 = lambda y: ref_layer_norm(y, layer.norm1.weight, layer.norm1.bias)
    ln2 = lambda y: ref_layer_norm(y, layer.norm2.weight, layer.norm2.bias)
    if norm_first:
        y = x + ref_mha(ln1(x), layer.self_attn, allowed)
        return y + ffn(ln2(y))
    y = ln1(x + ref_mha(x, layer.self_attn, allowed))
    return ln2(y + ffn(y))


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_matches_float64_equations(norm_first):
    enc = randomize(TransformerEncoder(DIM, H, 1, ff_dim=FF, norm_first=norm_first,
                                       attention_mask=masks.sliding_window(1, 2))).double().eval()
    x = features(B, N, DIM, dtype=torch.float64)
    idx = torch.arange(N)
    allowed = (idx[None, :] - idx[:, None] >= -1) & (idx[None, :] - idx[:, None] <= 2)  # j in [i - 1, i + 2]
    with torch.no_grad():
        want = ref_encoder_layer(x, enc.layers[0], allowed, norm_first)
        if norm_first:
            want = ref_layer_norm(want, enc.norm.weight, enc.norm.bias)
        got = enc(x)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_matches_torch_transformer_encoder(norm_first):
    layer = nn.TransformerEncoderLayer(DIM, H, FF, dropout=0.0, batch_first=True, norm_first=norm_first)
    ref = randomize(nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(DIM) if norm_first else None,
                                          enable_nested_tensor=False)).eval()
    enc = TransformerEncoder(DIM, H, 2, ff_dim=FF, norm_first=norm_first).eval()
    enc.load_state_dict(ref.state_dict())  # identical parameter names
    x = features(B, N, DIM)
    keep = torch.tensor([[True] * N, [True] * 3 + [False] * (N - 3)])
    with torch.no_grad():
        torch.testing.assert_close(enc(x), ref(x), atol=1e-5, rtol=1e-5)
        got, want = enc(x, key_keep_mask=keep), ref(x, src_key_padding_mask=~keep)
    torch.testing.assert_close(got[keep], want[keep], atol=1e-5, rtol=1e-5)


def test_decoder_matches_torch_transformer_decoder():
    layer = nn.TransformerDecoderLayer(DIM, H, FF, dropout=0.0, batch_first=True)
    ref = randomize(nn.TransformerDecoder(layer, 2)).eval()
    dec = TransformerDecoder(DIM, H, 2, ff_dim=FF).eval()
    dec.load_state_dict(ref.state_dict())
    x, memory = features(B, N, DIM), features(B, M, DIM, seed=2)
    mem_keep = torch.tensor([[True] * M, [True] * 4 + [False] * (M - 4)])
    causal = torch.ones(N, N, dtype=torch.bool).triu(1)  # torch polarity: True = not allowed
    with torch.no_grad():
        got = dec(x, memory, memory_keep_mask=mem_keep)
        want = ref(x, memory, tgt_mask=causal, memory_key_padding_mask=~mem_keep)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------- causality and padding
CAUSAL = ["softmax"] + [name for name, (_, causal) in MECHANISMS.items() if causal]


@pytest.mark.parametrize("attention", CAUSAL)
def test_lm_output_at_t_ignores_later_tokens(attention):
    lm = TransformerLM(V, dim=DIM, num_heads=H, num_layers=2, dropout=0.0, attention=attention).eval()
    tokens = torch.randint(0, V, (B, 19), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[:, 9:] = (changed[:, 9:] + 1) % V
    with torch.no_grad():
        a, b = lm(tokens), lm(changed)
    torch.testing.assert_close(a[:, :9], b[:, :9], atol=1e-5, rtol=0)
    assert (a[:, 9:] - b[:, 9:]).abs().max() > 1e-3  # the later positions do see the change


def test_seq2seq_decoder_is_causal_and_sees_the_source():
    model = Transformer(V, V + 2, dim=DIM, num_heads=H, dropout=0.0).eval()
    g = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(0, V, (B, M), generator=g), torch.randint(0, V + 2, (B, N), generator=g)
    tgt2, src2 = tgt.clone(), src.clone()
    tgt2[:, 3:] = (tgt2[:, 3:] + 1) % (V + 2)
    src2[:, -1] = (src2[:, -1] + 1) % V
    with torch.no_grad():
        out, out_tgt, out_src = model(src, tgt), model(src, tgt2), model(src2, tgt)
    torch.testing.assert_close(out[:, :3], out_tgt[:, :3], atol=0, rtol=0)
    assert (out - out_src).abs().min() > 0  # every target position attends to the whole source


def test_padded_sample_equals_sample_alone():
    torch.manual_seed(0)
    model = Transformer(V, dim=DIM, num_heads=H, dropout=0.0).eval()
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(0, V, (B, M), generator=g), torch.randint(0, V, (B, N), generator=g)
    src_keep = torch.tensor([[True] * M, [True] * 4 + [False] * (M - 4)])
    tgt_keep = torch.tensor([[True] * N, [True] * 3 + [False] * (N - 3)])
    with torch.no_grad():
        batch = model(src, tgt, src_keep_mask=src_keep, tgt_keep_mask=tgt_keep)
        alone = model(src[1:, :4], tgt[1:, :3])
    torch.testing.assert_close(batch[1, :3], alone[0], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rotary"])
def test_positions_break_permutation_equivariance(positional):
    """Without positions a bidirectional encoder is permutation-equivariant; each encoding breaks it."""
    g = torch.Generator().manual_seed(0)
    tokens, perm = torch.randint(0, V, (B, 9), generator=g), torch.randperm(9, generator=g)
    outs = {}
    for pos in (None, positional):
        torch.manual_seed(0)
        lm = TransformerLM(V, dim=DIM, num_heads=H, causal=False, dropout=0.0, positional=pos).eval()
        with torch.no_grad():
            outs[pos] = (lm(tokens)[:, perm], lm(tokens[:, perm]))
    torch.testing.assert_close(*outs[None], atol=1e-5, rtol=1e-5)
    assert (outs[positional][0] - outs[positional][1]).abs().max() > 1e-3


# -------------------------------------------------------------------------------- generation
def _count_fed(module):
    fed = []
    module.register_forward_pre_hook(lambda mod, args: fed.append(args[0].shape[1]))
    return fed


@pytest.mark.parametrize(("positional", "mask", "norm_first"), [
    ("sinusoidal", None, False), ("learned", masks.sliding_window(2, 0), True),
    ("rotary", masks.strided(3), False), (None, masks.fixed(3, 1), True)])
def test_lm_cached_generation_equals_recomputation(positional, mask, norm_first):
    torch.manual_seed(0)
    lm = TransformerLM(V, dim=DIM, num_heads=H, positional=positional, attention_mask=mask, norm_first=norm_first,
                       max_len=16).eval()
    fed = _count_fed(lm.embed)
    prefix = torch.randint(0, V, (B, 3), generator=torch.Generator().manual_seed(1))
    tokens, logits = lm.generate(prefix, 9, return_logits=True)
    assert fed == [3] + [1] * 8  # one new token per cached step
    fed.clear()
    tokens2, logits2 = lm.generate(prefix, 9, use_cache=False, return_logits=True)
    assert fed == list(range(3, 12))
    assert torch.equal(tokens, tokens2) and tokens.shape == (B, 12) and torch.equal(tokens[:, :3], prefix)
    torch.testing.assert_close(logits, logits2, atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # and the logits are those of a plain forward pass over the result
        torch.testing.assert_close(logits, lm(tokens)[:, 2:-1], atol=1e-5, rtol=1e-5)
    assert torch.equal(tokens[:, 3:], logits.argmax(-1))


def test_sampled_generation_reproducible_and_cache_independent():
    torch.manual_seed(0)
    lm = TransformerLM(V, dim=DIM, num_heads=H, positional="rotary").eval()
    prefix = torch.zeros(4, 1, dtype=torch.long)
    runs = [lm.generate(prefix, 10, temperature=1.5, generator=torch.Generator().manual_seed(7), use_cache=c)
            for c in (True, False, True)]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])
    other = lm.generate(prefix, 10, temperature=1.5, generator=torch.Generator().manual_seed(8))
    assert not torch.equal(runs[0], other)


def test_seq2seq_cached_generation_equals_recomputation():
    torch.manual_seed(0)
    model = Transformer(V, V + 2, dim=DIM, num_heads=H, positional="rotary", tie_embeddings=True).eval()
    g = torch.Generator().manual_seed(1)
    src, prefix = torch.randint(0, V, (B, M), generator=g), torch.randint(0, V + 2, (B, 1), generator=g)
    keep = torch.tensor([[True] * M, [True] * 5 + [False] * 2])
    a, la = model.generate(src, prefix, 8, src_keep_mask=keep, return_logits=True)
    b, lb = model.generate(src, prefix, 8, src_keep_mask=keep, use_cache=False, return_logits=True)
    assert torch.equal(a, b) and a.shape == (B, 9)
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=1e-5)
    alone = model.generate(src[1:, :5], prefix[1:], 8)
    assert torch.equal(alone, a[1:])
    assert model.head.weight is model.tgt_embed.embed.weight


def test_generation_stops_at_eos_and_pads_with_it():
    torch.manual_seed(0)
    lm = TransformerLM(V, dim=DIM, num_heads=H).eval()
    prefix = torch.randint(0, V, (3, 2), generator=torch.Generator().manual_seed(3))
    free = lm.generate(prefix, 8)
    eos = int(free[0, 4])  # row 0 emits this token by its third new position
    out = lm.generate(prefix, 8, eos=eos)
    firsts = []
    for row, ref in zip(out, free, strict=True):
        hits = (row[2:] == eos).nonzero()
        f = 2 + int(hits[0]) if len(hits) else None
        firsts.append(f)
        stop = out.shape[1] if f is None else f + 1
        assert torch.equal(row[:stop], ref[:stop])  # greedy: the same tokens up to the first eos
        if f is not None:
            assert bool((row[f:] == eos).all())
    assert firsts[0] is not None and firsts[0] <= 4
    want_len = max(firsts) + 1 if all(f is not None for f in firsts) else 10
    assert out.shape[1] == want_len


def test_generation_without_cache_for_other_mechanisms():
    lm = TransformerLM(V, dim=DIM, num_heads=H, attention="linear-attention").eval()
    out = lm.generate(torch.zeros(B, 2, dtype=torch.long), 4)
    assert out.shape == (B, 6)
    with pytest.raises(ArgumentError, match="softmax"):
        lm.generate(torch.zeros(B, 2, dtype=torch.long), 4, use_cache=True)


# ------------------------------------------------------------------ every attention= option
@pytest.mark.parametrize("attention", ["softmax", "multi-head", *MECHANISMS])
def test_every_attention_name_builds_and_trains(attention):
    causal_form = attention in CAUSAL or attention == "multi-head"
    for causal in ([False, True] if causal_form else [False]):
        lm = TransformerLM(V, dim=DIM, num_heads=H, num_layers=1, causal=causal, attention=attention,
                           max_len=19, dropout=0.0)
        tokens = torch.randint(0, V, (B, 19), generator=torch.Generator().manual_seed(0))
        logits = lm(tokens)
        assert logits.shape == (B, 19, V) and bool(torch.isfinite(logits).all())
        logits.logsumexp(-1).sum().backward()
        grads = [p.grad for p in lm.body.layers[0].self_attn.parameters() if p.grad is not None]
        assert grads and all(bool(torch.isfinite(g).all()) for g in grads)
        assert any(g.abs().sum() > 0 for g in grads)


def test_softmax_attention_mask_is_applied():
    torch.manual_seed(0)
    enc = TransformerEncoder(DIM, H, 1, attention_mask=masks.sliding_window(1, 1)).eval()
    x = features(B, 9, DIM)
    y = x.clone()
    y[:, 8] += 1.0  # outside the window of position 0 after one layer (window 1 -> reach 1)
    with torch.no_grad():
        torch.testing.assert_close(enc(x)[:, :7], enc(y)[:, :7], atol=0, rtol=0)
        assert (enc(x)[:, 7:] - enc(y)[:, 7:]).abs().max() > 1e-3


def test_factory_gets_causal_and_key_keep_mask_when_it_takes_them():
    lm = TransformerLM(V, dim=DIM, num_heads=H, attention=functools.partial(LocalAttention, size=2), dropout=0.0)
    assert all(isinstance(layer.self_attn, LocalAttention) and layer.self_attn.causal for layer in lm.body.layers)
    enc = TransformerLM(V, dim=DIM, num_heads=H, causal=False, attention=functools.partial(LocalAttention, size=2))
    assert not enc.body.layers[0].self_attn.causal
    seen = []

    class Recording(nn.Module):
        def __init__(self, dim, num_heads):
            super().__init__()
            self.inner = SoftmaxSelfAttention(dim, num_heads)

        def forward(self, x, *, key_keep_mask=None):
            seen.append(key_keep_mask)
            return self.inner(x, key_keep_mask=key_keep_mask)

    model = TransformerEncoder(DIM, H, 1, attention=Recording)
    keep = torch.tensor([[True] * N, [True] * 2 + [False] * 3])
    model(features(B, N, DIM), key_keep_mask=keep)
    assert seen and seen[0] is keep


def test_bad_factories_raise():
    with pytest.raises(DTypeError, match=r"nn\.Module"):
        TransformerEncoder(DIM, H, 1, attention=lambda dim, heads: "not a module")
    enc = TransformerEncoder(DIM, H, 1, attention=lambda dim, heads: nn.Linear(dim, dim + 1))
    with pytest.raises(ShapeError, match="same shape"):
        enc(features(B, N, DIM))


@pytest.mark.parametrize(("build", "error", "match"), [
    (lambda: TransformerEncoder(DIM, H, attention="flash"), ArgumentError, "'performer'"),
    (lambda: TransformerEncoder(DIM, H, attention=3), DTypeError, "attention must be"),
    (lambda: TransformerLM(V, dim=DIM, num_heads=H, attention="longformer"), ArgumentError, "no causal form"),
    (lambda: TransformerLM(V, dim=DIM, num_heads=H, attention="performer", positional="rotary"), ArgumentError,
     "rotary"),
    (lambda: TransformerEncoder(DIM, H, attention="local", attention_mask=masks.causal()), ArgumentError,
     "attention_mask"),
    (lambda: TransformerEncoder(DIM, H, attention_mask=torch.ones(3, 3, dtype=torch.bool)), DTypeError, "Mask"),
    (lambda: TransformerEncoder(DIM, H, attention="linformer"), ArgumentError, "max_len"),
    (lambda: TransformerEncoder(DIM, 5), ArgumentError, "divisible"),
    (lambda: TransformerEncoder(DIM, H, activation="tanh"), ArgumentError, "activation"),
    (lambda: TransformerEncoder(DIM, H, dropout=1.5), ArgumentError, "dropout"),
    (lambda: TransformerLM(V, dim=DIM, num_heads=H, positional="alibi"), ArgumentError, "positional"),
    (lambda: TransformerLM(V, dim=DIM, num_heads=H, positional="learned", max_len=None), ArgumentError, "max_len"),
])
def test_bad_construction_raises(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_bad_inputs_raise():
    lm = TransformerLM(V, dim=DIM, num_heads=H, positional="learned", max_len=8)
    tokens = torch.randint(0, V, (B, N))
    with pytest.raises(DTypeError, match="integer"):
        lm(tokens.float())
    with pytest.raises(ArgumentError, match=r"\[0, 11\)"):
        lm(tokens + V)
    with pytest.raises(ShapeError, match=r"\(batch, n\)"):
        lm(tokens[0])
    with pytest.raises(ShapeError, match="key_keep_mask"):
        lm(tokens, key_keep_mask=torch.ones(N, B, dtype=torch.bool))
    with pytest.raises(DTypeError, match="bool"):
        lm(tokens, key_keep_mask=torch.ones(B, N))
    with pytest.raises(ShapeError, match="max_len=8"):
        lm.generate(tokens, 4)
    for kwargs, match in (({"temperature": -1.0}, "temperature"), ({"eos": V}, "eos"),
                          ({"generator": 3}, "generator")):
        with pytest.raises((ArgumentError, DTypeError), match=match):
            lm.generate(tokens[:, :2], 2, **kwargs)
    with pytest.raises(ArgumentError, match="causal"):
        TransformerLM(V, dim=DIM, num_heads=H, causal=False).generate(tokens, 2)
    padded = torch.tensor([[True] * N, [True] * 3 + [False] * 2])
    with pytest.raises(ArgumentError, match="key_keep_mask"):
        TransformerEncoder(DIM, H, attention="local")(features(B, N, DIM), key_keep_mask=padded)
    with pytest.raises(ShapeError, match="dim=12"):
        TransformerEncoder(DIM, H)(features(B, N, DIM + 1))
    with pytest.raises(ArgumentError, match="memory"):
        TransformerDecoder(DIM, H)(features(B, N, DIM))


# ----------------------------------------------------------------------------- training
def _fit(model, loss_fn, steps, lr=1e-2):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()
    return loss.item()


def test_lm_overfits_a_batch():
    torch.manual_seed(0)
    lm = TransformerLM(V, dim=16, num_heads=2, num_layers=2, dropout=0.0, norm_first=True)
    data = torch.randint(0, V, (4, 10), generator=torch.Generator().manual_seed(1))
    loss = _fit(lm, lambda: nn.functional.cross_entropy(lm(data[:, :-1]).flatten(0, 1), data[:, 1:].flatten()), 120)
    lm.eval()
    assert loss < 0.05
    assert torch.equal(lm.generate(data[:, :1], 9), data)  # it reproduces the memorised sequences


def test_seq2seq_overfits_reversal():
    torch.manual_seed(0)
    model = Transformer(V, dim=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, dropout=0.0)
    src = torch.randint(1, V, (6, 6), generator=torch.Generator().manual_seed(2))
    tgt = torch.cat([torch.zeros(6, 1, dtype=torch.long), src.flip(1)], 1)  # BOS = 0, then the reversed source
    loss = _fit(model, lambda: nn.functional.cross_entropy(model(src, tgt[:, :-1]).flatten(0, 1),
                                                           tgt[:, 1:].flatten()), 120)
    model.eval()
    assert loss < 0.05
    assert torch.equal(model.generate(src, tgt[:, :1], 6), tgt)


def test_dropout_only_in_training_and_state_dict_round_trip():
    torch.manual_seed(0)
    lm = TransformerLM(V, dim=DIM, num_heads=H, dropout=0.5, tie_embeddings=True)
    tokens = torch.randint(0, V, (B, N))
    assert not torch.equal(lm(tokens), lm(tokens))
    lm.eval()
    assert torch.equal(lm(tokens), lm(tokens))
    assert lm.head.weight is lm.embed.embed.weight
    clone = TransformerLM(V, dim=DIM, num_heads=H, dropout=0.5, tie_embeddings=True).eval()
    clone.load_state_dict(lm.state_dict())
    assert torch.equal(clone(tokens), lm(tokens))


def test_softmax_self_attention_is_multi_head_attention_exactly():
    """SoftmaxSelfAttention calls MultiHeadAttention's private _project/_attend: pin that it stays the same
    function (same state_dict keys, bitwise the same output), that the pair handles grouped-query heads, and
    that the weight dropout runs in training only."""
    pattern = masks.sliding_window(2, 0)
    sa = randomize(SoftmaxSelfAttention(DIM, H, causal=True, mask=pattern, dropout=0.5)).eval()
    mha = MultiHeadAttention(DIM, H, 0.5, batch_first=True).eval()
    assert list(sa.state_dict()) == list(mha.state_dict())  # torch's keys: checkpoints load both ways
    mha.load_state_dict(sa.state_dict())
    x, keep = features(B, N, DIM), torch.tensor([[True] * N, [True] * 3 + [False] * (N - 3)])
    want = mha(x, x, x, need_weights=False, mask=masks.causal() & pattern & masks.keys(keep))[0]
    assert torch.equal(sa(x, key_keep_mask=keep), want)
    gqa = randomize(MultiHeadAttention(DIM, H, batch_first=True, num_kv_heads=1)).eval()
    q, k, v = gqa._project(x, x, x)
    assert q.shape == (B, H, N, DIM // H) and k.shape == v.shape == (B, 1, N, DIM // H)
    out = gqa._attend(q, k, v, masks.causal(), None, False, True, True)[0]
    assert torch.equal(out, gqa(x, x, x, need_weights=False, is_causal=True)[0])
    assert torch.equal(sa(x), sa(x))
    sa.train()
    assert not torch.equal(sa(x), sa(x))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_cached_generation_with_eos_joins_the_same_tokens_and_logits_as_recomputing(temperature):
    """The cached loop feeds the new token alone and joins the sequence once at the end; with eos padding and early
    stop, greedy or sampled from one seed, its tokens and logits are those of recomputing the whole sequence."""
    torch.manual_seed(0)
    lm = TransformerLM(V, dim=DIM, num_heads=H).eval()
    prefix = torch.randint(0, V, (3, 2), generator=torch.Generator().manual_seed(3))
    eos = int(lm.generate(prefix, 8)[0, 4])
    runs = [lm.generate(prefix, 8, eos=eos, temperature=temperature, use_cache=cached, return_logits=True,
                        generator=torch.Generator().manual_seed(5)) for cached in (True, False)]
    (a, la), (b, lb) = runs
    assert torch.equal(a, b) and a.dtype == prefix.dtype and torch.equal(a[:, :2], prefix)
    torch.testing.assert_close(la, lb, atol=1e-5, rtol=1e-5)
    assert la.shape == (3, a.shape[1] - 2, V)
