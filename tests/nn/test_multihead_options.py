"""MultiHeadAttention's x-transformers options, each against a float64 transcription of its formula written here.

The transcriptions read the module's own parameters (so gradients reach them too) and share no code with
attnkit: scores, masks and softmax are spelled out per option.
"""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import ArgumentError
from attnkit.nn.multihead import MultiHeadAttention

B, L, E, H = 2, 6, 12, 3  # head_dim 4
F64 = {"atol": 1e-12, "rtol": 1e-10}


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(seed=0, **options):
    """A float64 module with every parameter random (identity / zero initialisations exercised away from them)."""
    torch.manual_seed(seed)
    m = MultiHeadAttention(E, H, batch_first=True, dtype=torch.float64, **options)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.4)
    return m


def inputs(seed=1, length=L):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, length, E, generator=g, dtype=torch.float64)


# ---------------------------------------------------------------- the transcription's pieces
def project(m, x):
    """q (B, H, L, d), k and v (B, Hkv, L, d) from the packed in_proj."""
    e, kv, d = m.inner_dim, m.num_kv_heads * m.head_dim, m.head_dim
    w, b = m.in_proj_weight, m.in_proj_bias
    q = x @ w[:e].T + b[:e]
    k = x @ w[e:e + kv].T + b[e:e + kv]
    v = x @ w[e + kv:].T + b[e + kv:]
    split = lambda t: t.reshape(t.shape[0], t.shape[1], -1, d).transpose(1, 2)
    return split(q), split(k), split(v)


def per_query_head(m, t):
    return t.repeat_interleave(m.num_heads // m.num_kv_heads, 1)


def merge(m, o):
    """(B, H, L, d) -> the output projection of the concatenated heads."""
    o = o.transpose(1, 2).reshape(o.shape[0], o.shape[2], -1)
    return o @ m.out_proj.weight.T + m.out_proj.bias


def softmax(scores, allowed):
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)


def allowed_keys(lq, lk, causal):
    i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
    return j <= i + lk - lq if causal else torch.ones(lq, lk, dtype=torch.bool)


def plain(m, x, causal=True):
    q, k, v = project(m, x)
    k, v = per_query_head(m, k), per_query_head(m, v)
    s = q @ k.transpose(-1, -2) / m.head_dim ** 0.5
    return merge(m, softmax(s, allowed_keys(L, L, causal)) @ v)


def run(m, x, causal=True, **kwargs):
    return m(x, x, x, is_causal=causal, need_weights=False, **kwargs)[0]


def same_with_gradients(m, x, module_out, oracle_out):
    """Outputs equal, and so are the gradients of one random projection of them for every parameter and x."""
    torch.testing.assert_close(module_out, oracle_out, **F64)
    r = torch.randn_like(module_out)
    params = [p for p in m.parameters()] + [x]
    got = torch.autograd.grad((module_out * r).sum(), params, allow_unused=True)
    want = torch.autograd.grad((oracle_out * r).sum(), params, allow_unused=True)
    for name, a, b in zip([n for n, _ in m.named_parameters()] + ["x"], got, want, strict=True):
        if a is None or b is None:
            assert (a is None or not a.any()) and (b is None or not b.any()), name
        else:
            torch.testing.assert_close(a, b, **F64, msg=name)


# ---------------------------------------------------------------- talking heads
def talking(m, x, causal):
    """Shazeer et al. 2020, Alg. 1: logits mixed across heads by P before the softmax, weights by Q after."""
    q, k, v = project(m, x)
    k, v = per_query_head(m, k), per_query_head(m, v)
    logits = q @ k.transpose(-1, -2) / m.head_dim ** 0.5  # (B, H, L, L)
    pre = torch.eye(H, dtype=x.dtype) if m.pre_talking_heads is None else m.pre_talking_heads
    post = torch.eye(H, dtype=x.dtype) if m.post_talking_heads is None else m.post_talking_heads
    mixed = torch.stack([sum(pre[h, g] * logits[:, g] for g in range(H)) for h in range(H)], 1)
    w = softmax(mixed, allowed_keys(L, L, causal))
    w = torch.stack([sum(post[h, g] * w[:, g] for g in range(H)) for h in range(H)], 1)
    return merge(m, w @ v)


@pytest.mark.parametrize("which", ["pre", "post", "both"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", [3, 1])
def test_talking_heads_equal_their_transcription(which, causal, kv_heads):
    m, x = build(talking_heads=which, num_kv_heads=kv_heads), inputs().requires_grad_()
    same_with_gradients(m, x, run(m, x, causal), talking(m, x, causal))


def test_talking_heads_start_as_identity_and_then_equal_plain_attention():
    torch.manual_seed(0)
    m = MultiHeadAttention(E, H, batch_first=True, dtype=torch.float64, talking_heads="both")
    assert torch.equal(m.pre_talking_heads, torch.eye(H, dtype=torch.float64))
    assert torch.equal(m.post_talking_heads, torch.eye(H, dtype=torch.float64))
    x = inputs()
    torch.testing.assert_close(run(m, x), plain(m, x), **F64)


# ---------------------------------------------------------------- memory key-values
def memory(m, x, causal, padding=None, bias=None):
    """Sukhbaatar et al. 2019, eq. 5-6: M learned key/value pairs before the sequence's, visible to every query."""
    q, k, v = project(m, x)
    k = torch.cat([m.memory_k.expand(B, -1, -1, -1), k], 2)
    v = torch.cat([m.memory_v.expand(B, -1, -1, -1), v], 2)
    k, v = per_query_head(m, k), per_query_head(m, v)
    n = m.memory_k.shape[1]
    s = q @ k.transpose(-1, -2) / m.head_dim ** 0.5
    if bias is not None:
        s = s + torch.cat([torch.zeros(L, n, dtype=s.dtype), bias], 1)
    allowed = torch.cat([torch.ones(L, n, dtype=torch.bool), allowed_keys(L, L, causal)], 1).expand(B, 1, L, L + n)
    if padding is not None:  # True = padding, as torch
        allowed = allowed & torch.cat([torch.zeros(B, n, dtype=torch.bool), padding], 1)[:, None, None, :].logical_not()
    w = softmax(s, allowed)
    return merge(m, w @ v), w


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", [3, 1])
def test_memory_key_values_equal_their_transcription(causal, kv_heads):
    m, x = build(num_memory_kv=2, num_kv_heads=kv_heads), inputs().requires_grad_()
    same_with_gradients(m, x, run(m, x, causal), memory(m, x, causal)[0])


def test_memory_key_values_with_padding_a_float_mask_and_weights():
    m, x = build(num_memory_kv=3), inputs()
    padding = torch.zeros(B, L, dtype=torch.bool)
    padding[1, -2:] = True
    bias = torch.randn(L, L, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    float_padding = torch.zeros(B, L, dtype=torch.float64).masked_fill(padding, float("-inf"))  # as the bias's type
    out, weights = m(x, x, x, key_padding_mask=float_padding, attn_mask=bias, average_attn_weights=False)
    want, want_weights = memory(m, x, False, padding, bias)
    torch.testing.assert_close(out, want, **F64)
    torch.testing.assert_close(weights, want_weights, **F64)  # (N, H, L, M + S): the memory columns first


# ---------------------------------------------------------------- value residual
@pytest.mark.parametrize("kind", [True, "learned"])
def test_value_residual_equals_its_transcription(kind):
    first, m = build(1), build(value_residual=kind)
    x0, x = inputs(2), inputs().requires_grad_()
    _, _, v1 = first(x0, x0, x0, need_weights=False, return_values=True)
    torch.testing.assert_close(v1, project(first, x0)[2], **F64)  # the layer's own values, (N, Hkv, S, d)
    q, k, v = project(m, x)
    if kind is True:
        mixed = 0.5 * v + 0.5 * v1
    else:  # a per-token, per-head gate from the layer's value input (x-transformers' learned mix)
        lin = m.value_residual_mix
        mix = torch.sigmoid(x @ lin.weight.T + lin.bias).transpose(1, 2)[..., None]
        mixed = mix * v + (1 - mix) * v1
    s = q @ k.transpose(-1, -2) / m.head_dim ** 0.5
    want = merge(m, softmax(s, allowed_keys(L, L, True)) @ mixed)
    same_with_gradients(m, x, run(m, x, value_residual=v1), want)


def test_value_residual_neutral_settings_equal_plain_attention():
    m, x = build(value_residual=True), inputs()
    own = m(x, x, x, need_weights=False, return_values=True)[2]
    torch.testing.assert_close(run(m, x), plain(m, x), **F64)  # no first-layer values: no mixing
    torch.testing.assert_close(run(m, x, value_residual=own), plain(m, x), **F64)  # mixed with itself


# ---------------------------------------------------------------- selective attention
def selective(m, x):
    """Leviathan et al. 2024, Alg. 1: head 0's relu'd causal logits, summed over earlier queries, subtracted."""
    q, k, v = project(m, x)
    k, v = per_query_head(m, k), per_query_head(m, v)
    s = q @ k.transpose(-1, -2) / m.head_dim ** 0.5
    sel = torch.relu(s[:, 0])  # (B, L, L): S_tj
    penalty = torch.zeros_like(sel)
    for i in range(L):
        for j in range(L):
            penalty[:, i, j] = sum((sel[:, t, j] for t in range(i) if 0 < j < t), torch.zeros(B, dtype=x.dtype))
    return merge(m, softmax(s - penalty[:, None], allowed_keys(L, L, True)) @ v)


@pytest.mark.parametrize("kv_heads", [3, 1])
def test_selective_attention_equals_its_transcription(kv_heads):
    m, x = build(selective=True, num_kv_heads=kv_heads), inputs().requires_grad_()
    same_with_gradients(m, x, run(m, x), selective(m, x))


def test_selective_attention_whose_selecting_head_selects_nothing_is_plain_attention():
    m, x = build(selective=True), inputs()
    with torch.no_grad():  # head 0's queries zero: its logits are 0, relu(0) = 0, nothing is masked
        m.in_proj_weight[:m.head_dim] = 0
        m.in_proj_bias[:m.head_dim] = 0
    torch.testing.assert_close(run(m, x), plain(m, x), **F64)


# ---------------------------------------------------------------- CoPE
def cope(m, x):
    """Golovneva et al. 2024, eq. 3-5: gated counts p_ij, the embeddings interpolated at p_ij added to the keys."""
    q, k, v = project(m, x)
    k, v = per_query_head(m, k), per_query_head(m, v)
    e, s = m.cope_positions, m.head_dim ** -0.5
    last = e.shape[0] - 1
    scores = torch.full((B, H, L, L), float("-inf"), dtype=x.dtype)
    rows = []
    for i in range(L):
        row = []
        for j in range(L):
            if j > i:
                row.append(scores[:, :, i, j])
                continue
            p = sum(torch.sigmoid(s * (q[:, :, i] * k[:, :, t]).sum(-1)) for t in range(j, i + 1)).clamp(max=last)
            lo, hi = p.floor().long(), p.ceil().long()
            frac = (p - p.floor())[..., None]
            emb = frac * e[hi] + (1 - frac) * e[lo]  # (B, H, d)
            row.append(s * (q[:, :, i] * (k[:, :, j] + emb)).sum(-1))
        rows.append(torch.stack(row, -1))
    scores = torch.stack(rows, -2)
    return merge(m, torch.softmax(scores, -1) @ v)


@pytest.mark.parametrize("kv_heads", [3, 1])
def test_cope_equals_its_transcription(kv_heads):
    m, x = build(cope=4, num_kv_heads=kv_heads), inputs().requires_grad_()  # 4 positions < L: counts clamp
    same_with_gradients(m, x, run(m, x), cope(m, x))


def test_cope_starts_at_zero_embeddings_which_is_plain_causal_attention():
    torch.manual_seed(0)
    m = MultiHeadAttention(E, H, batch_first=True, dtype=torch.float64, cope=8)
    assert not m.cope_positions.any() and m.cope_positions.shape == (8, m.head_dim)
    x = inputs()
    torch.testing.assert_close(run(m, x), plain(m, x), **F64)


# ---------------------------------------------------------------- top-k
def topk(m, x, k_keep, causal, padding=None):
    """Zhao et al. 2019, eq. 6-7: each query's k largest allowed scores kept, the others masked."""
    q, k, v = project(m, x)
    k, v = per_query_head(m, k), per_query_head(m, v)
    s = q @ k.transpose(-1, -2) / m.head_dim ** 0.5
    allowed = allowed_keys(L, L, causal).expand(B, H, L, L)
    if padding is not None:
        allowed = allowed & ~padding[:, None, None, :]
    keep = torch.zeros_like(allowed)
    for index in torch.cartesian_prod(*(torch.arange(n) for n in (B, H, L))).tolist():
        b, h, i = index
        row = [(s[b, h, i, j].item(), j) for j in range(L) if allowed[b, h, i, j]]
        for _, j in sorted(row, reverse=True)[:k_keep]:
            keep[b, h, i, j] = True
    w = softmax(s, keep)
    return merge(m, w @ v), w


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", [3, 1])
def test_topk_equals_its_transcription(causal, kv_heads):
    m, x = build(topk=3, num_kv_heads=kv_heads), inputs().requires_grad_()
    same_with_gradients(m, x, run(m, x, causal), topk(m, x, 3, causal)[0])


def test_topk_with_padding_and_weights():
    m, x = build(topk=2), inputs()
    padding = torch.zeros(B, L, dtype=torch.bool)
    padding[0, 1:3] = True
    out, weights = m(x, x, x, key_padding_mask=padding, average_attn_weights=False)
    want, want_weights = topk(m, x, 2, False, padding)
    torch.testing.assert_close(out, want, **F64)
    torch.testing.assert_close(weights, want_weights, **F64)


def test_topk_of_every_key_is_plain_attention():
    m, x = build(topk=L), inputs()
    torch.testing.assert_close(run(m, x, False), plain(m, x, False), **F64)


# ---------------------------------------------------------------- L2-distance scores
def l2(m, x, causal):
    """Kim et al. 2021, eq. 2: scores -|q_i - k_j|^2 / sqrt(d)."""
    q, k, v = project(m, x)
    k, v = per_query_head(m, k), per_query_head(m, v)
    s = -((q[..., :, None, :] - k[..., None, :, :]) ** 2).sum(-1) / m.head_dim ** 0.5
    w = softmax(s, allowed_keys(L, L, causal))
    return merge(m, w @ v), w


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", [3, 1])
def test_l2_distance_scores_equal_their_transcription(causal, kv_heads):
    m, x = build(scores="l2", num_kv_heads=kv_heads), inputs().requires_grad_()
    same_with_gradients(m, x, run(m, x, causal), l2(m, x, causal)[0])
    weights = m(x, x, x, is_causal=causal)[1]
    torch.testing.assert_close(weights, l2(m, x, causal)[1].mean(1), **F64)


# ---------------------------------------------------------------- LASER
def laser(m, x, causal):
    """Duvvuri & Dhillon 2024, eq. 4: log(softmax(scores) exp(V))."""
    q, k, v = project(m, x)
    k, v = per_query_head(m, k), per_query_head(m, v)
    s = q @ k.transpose(-1, -2) / m.head_dim ** 0.5
    return merge(m, torch.log(softmax(s, allowed_keys(L, L, causal)) @ torch.exp(v)))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", [3, 1])
def test_laser_equals_its_transcription(causal, kv_heads):
    m, x = build(laser=True, num_kv_heads=kv_heads), inputs().requires_grad_()
    same_with_gradients(m, x, run(m, x, causal), laser(m, x, causal))


# ---------------------------------------------------------------- decoding, refusals, the rest
@pytest.mark.parametrize("options", [{"talking_heads": "both"}, {"num_memory_kv": 2}, {"topk": 2}, {"scores": "l2"},
                                     {"laser": True}, {"value_residual": "learned"}])
def test_decoding_with_a_cache_equals_the_full_pass(options):
    m, x = build(**options), inputs()
    first = torch.randn(B, m.num_kv_heads, L, m.head_dim, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(5))
    vr = first if options.get("value_residual") else None
    full = run(m, x, value_residual=vr)
    cache = m.new_cache(B, L)
    steps = []
    for a, b in ((0, 3), (3, 4), (4, 6)):
        kw = {} if vr is None else {"value_residual": vr[:, :, a:b]}
        steps.append(m.forward_step(x[:, a:b], cache, **kw)[0])
    torch.testing.assert_close(torch.cat(steps, 1), full, **F64)


@pytest.mark.parametrize("options", [{"selective": True}, {"cope": 4}])
def test_selective_and_cope_refuse_decoding_and_other_masks(options):
    m, x = build(**options), inputs()
    with pytest.raises(ArgumentError, match="no incremental form"):
        m.forward_step(x[:, :2], m.new_cache(B, L))
    with pytest.raises(ArgumentError, match="is_causal=True and no other mask"):
        m(x, x, x, need_weights=False)
    with pytest.raises(ArgumentError, match="is_causal=True and no other mask"):
        m(x, x, x, key_padding_mask=torch.zeros(B, L, dtype=torch.bool), is_causal=True, need_weights=False)


@pytest.mark.parametrize("options", [{"talking_heads": "pre"}, {"laser": True}])
def test_options_without_one_attention_map_refuse_need_weights(options):
    m, x = build(**options), inputs()
    with pytest.raises(ArgumentError, match="need_weights=False"):
        m(x, x, x)


def test_refusals_name_the_reason():
    with pytest.raises(ArgumentError, match="do not compose"):
        MultiHeadAttention(E, H, topk=2, laser=True)
    with pytest.raises(ArgumentError, match="talking_heads must be"):
        MultiHeadAttention(E, H, talking_heads="middle")
    with pytest.raises(ArgumentError, match="scores must be"):
        MultiHeadAttention(E, H, scores="cosine")
    with pytest.raises(ArgumentError, match="topk must be an int >= 1"):
        MultiHeadAttention(E, H, topk=0)
    m, x = build(topk=2), inputs()
    with pytest.raises(ArgumentError, match="float attn_mask"):
        m(x, x, x, attn_mask=torch.zeros(L, L, dtype=torch.float64))
    with pytest.raises(ArgumentError, match="quantized KV cache"):
        m.forward_step(x[:, :1], m.new_cache(B, L, kv_format="int8"))
    with pytest.raises(ArgumentError, match="needs a module built with value_residual"):
        m(x, x, x, value_residual=torch.zeros(B, H, L, m.head_dim, dtype=torch.float64))
    with pytest.raises(ArgumentError, match="x-transformers options"):
        m.to_torch()


def test_options_keep_plain_attention_and_the_state_dict_unchanged_when_unset():
    torch.manual_seed(0)
    a = MultiHeadAttention(E, H)
    torch.manual_seed(0)
    b = MultiHeadAttention(E, H, talking_heads=None, num_memory_kv=0, value_residual=False, selective=False,
                           cope=None, topk=None, scores="dot", laser=False)
    assert a.state_dict().keys() == b.state_dict().keys() and repr(a) == repr(b)
    m = build(talking_heads="both", num_memory_kv=0, value_residual="learned")
    assert {"pre_talking_heads", "post_talking_heads", "value_residual_mix.weight"} <= set(m.state_dict())
    assert "talking_heads='both'" in repr(m) and "value_residual='learned'" in repr(m)


# ---------------------------------------------------------------- neutral settings across torch's configurations
CONFIGS = {
    "sequence first": {},
    "cross-attention (kdim, vdim)": {"kdim": 7, "vdim": 5},
    "bias_k and zero attention": {"add_bias_kv": True, "add_zero_attn": True},
    "grouped heads, QK-norm, rotary, gate": {"num_kv_heads": 1, "qk_norm": True, "rotary": True, "gate": True},
}


@pytest.mark.parametrize("neutral", [{"talking_heads": "both"}, {"topk": 64}])
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("unbatched", [False, True])
def test_neutral_options_equal_plain_attention_in_torchs_configurations(neutral, config, unbatched):
    """Identity talking heads and top-k of every key, with padding, float masks (not top-k), extra keys, layouts."""
    options = CONFIGS[config]
    torch.manual_seed(0)
    plain_module = MultiHeadAttention(E, H, dtype=torch.float64, **options)
    with torch.no_grad():
        for p in plain_module.parameters():
            p.normal_(0, 0.4)
    module = MultiHeadAttention(E, H, dtype=torch.float64, **options, **neutral)
    module.load_state_dict(plain_module.state_dict(), strict=False)
    g = torch.Generator().manual_seed(4)
    s = 5
    batch = () if unbatched else (B,)
    q = torch.randn(L, *batch, E, generator=g, dtype=torch.float64)
    k = torch.randn(s, *batch, options.get("kdim", E), generator=g, dtype=torch.float64)
    v = torch.randn(s, *batch, options.get("vdim", E), generator=g, dtype=torch.float64)
    padding = torch.zeros(*batch, s, dtype=torch.bool)
    padding[..., -1] = True
    masks = {"key_padding_mask": padding}
    if "topk" not in neutral:
        masks["attn_mask"] = torch.randn(L, s, generator=g, dtype=torch.float64)
        masks["key_padding_mask"] = torch.zeros(padding.shape, dtype=torch.float64).masked_fill(padding, -1e9)
    want = plain_module(q, k, v, need_weights=False, **masks)[0]
    torch.testing.assert_close(module(q, k, v, need_weights=False, **masks)[0], want, **F64)


def test_a_module_pickled_before_the_options_runs_with_them_off():
    m, x = build(), inputs()
    old = m.__getstate__()
    for name in ("talking_heads", "topk", "attention_option", "scores", "laser", "selective", "value_residual",
                 "value_residual_mix"):
        old.pop(name, None)
    old["_parameters"] = {k: p for k, p in old["_parameters"].items() if p is not None}
    restored = MultiHeadAttention.__new__(MultiHeadAttention)
    restored.__setstate__(old)
    torch.testing.assert_close(run(restored, x), plain(m, x), **F64)
    assert repr(restored) == repr(m)


@pytest.mark.parametrize("options", [{"num_memory_kv": 2}, {"talking_heads": "both"}, {"laser": True}])
def test_options_run_inside_torchs_encoder_layer(options):
    layer = torch.nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, batch_first=True, dtype=torch.float64).eval()
    m = build(**options)
    layer.self_attn = m
    x = inputs()
    mask = torch.nn.Transformer.generate_square_subsequent_mask(L, dtype=torch.float64)
    attended = m(x, x, x, attn_mask=mask, is_causal=True, need_weights=False)[0]
    want = layer.norm1(x + attended)
    want = layer.norm2(want + layer.linear2(torch.relu(layer.linear1(want))))
    torch.testing.assert_close(layer(x, src_mask=mask, is_causal=True), want, **F64)


def test_value_residual_unbatched_takes_and_returns_values_without_the_batch():
    first, m = build(1), build(value_residual=True)
    x0, x = inputs(2)[0], inputs()[0]
    *_, v1 = first(x0, x0, x0, need_weights=False, return_values=True)
    assert v1.shape == (m.num_kv_heads, L, m.head_dim)
    got = m(x, x, x, is_causal=True, need_weights=False, value_residual=v1)[0]
    want = m(x[None], x[None], x[None], is_causal=True, need_weights=False, value_residual=v1[None])[0][0]
    torch.testing.assert_close(got, want, **F64)
