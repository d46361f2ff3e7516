"""DotProductAttention, MultiHeadAttention (a torch.nn.MultiheadAttention drop-in) and KVCache."""

from __future__ import annotations

import itertools
import math
import warnings

import pytest
import torch
from torch import nn

import attnkit
from attnkit import masks
from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.nn.kv_cache import KVCache
from attnkit.nn.multihead import DotProductAttention, MultiHeadAttention
from attnkit.registry import get

E, H, N, L, S, KDIM, VDIM = 12, 3, 2, 5, 7, 11, 13  # head_dim 4; distinct sizes so swapped axes fail
TOL = {torch.float32: {"atol": 2e-5, "rtol": 1e-4}, torch.float64: {"atol": 1e-12, "rtol": 1e-10}}


@pytest.fixture(autouse=True)
def _one_thread():
    """These problems are tiny: one thread avoids oversubscription on a shared machine (restored after)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------- builders
def torch_mha(seed=0, dtype=torch.float32, *, kv=False, bias=True, add_bias_kv=False, add_zero_attn=False,
              batch_first=False, dropout=0.0):
    """A torch module with every parameter random (so zero-initialised biases are exercised too)."""
    torch.manual_seed(seed)
    mod = nn.MultiheadAttention(E, H, dropout=dropout, bias=bias, add_bias_kv=add_bias_kv,
                                add_zero_attn=add_zero_attn, kdim=KDIM if kv else None, vdim=VDIM if kv else None,
                                batch_first=batch_first, dtype=dtype)
    with torch.no_grad():
        for p in mod.parameters():
            p.normal_(0, 0.4)
    return mod


def qkv(mod, *, unbatched=False, seed=1, lq=L, s=S):
    g = torch.Generator().manual_seed(seed)
    dt = mod.out_proj.weight.dtype

    def make(length, dim):
        shape = (length, dim) if unbatched else (N, length, dim) if mod.batch_first else (length, N, dim)
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dt)
    return make(lq, E), make(s, mod.kdim), make(s, mod.vdim)


def torch_style_masks(kpm_kind, am_kind, *, unbatched=False, seed=2, dtype=torch.float32):
    """Random torch masks (bool: True = ignore; float: additive) that leave key 0 open to every query."""
    g = torch.Generator().manual_seed(seed)
    batch = () if unbatched else (N,)
    kpm = am = None
    if kpm_kind == "bool":
        kpm = torch.rand(*batch, S, generator=g) < 0.4
        kpm[..., 0] = False
    elif kpm_kind == "float":
        kpm = torch.randn(*batch, S, generator=g, dtype=dtype)
        kpm[..., 3] = float("-inf")
    if am_kind != "none":
        lead = () if am_kind.endswith("2") else (H,) if unbatched else (N * H,)
        if am_kind.startswith("bool"):
            am = torch.rand(*lead, L, S, generator=g) < 0.4
            am[..., 0] = False
        else:
            am = torch.randn(*lead, L, S, generator=g, dtype=dtype)
            am[..., 1:, 2] = float("-inf")
    return kpm, am


MASK_KINDS = [("none", a) for a in ("none", "bool2", "bool3", "float2", "float3")] + [
    (kpm, a) for kpm in ("bool", "float") for a in ("none", "bool2", "bool3", "float2", "float3")]  # mixed too
CONFIGS = [dict(zip(("batch_first", "kv", "add_bias_kv", "add_zero_attn", "bias"), c, strict=True))
           for c in itertools.product((False, True), repeat=5)]


def assert_same_call(ours, theirs, args, kwargs, dtype):
    out_a, w_a = theirs(*args, **kwargs)
    out_b, w_b = ours(*args, **kwargs)
    assert out_b.shape == out_a.shape and out_b.dtype == out_a.dtype
    torch.testing.assert_close(out_b, out_a, **TOL[dtype])
    if kwargs.get("need_weights", True):
        assert w_b.shape == w_a.shape
        torch.testing.assert_close(w_b, w_a, **TOL[dtype])
    else:
        assert w_a is None and w_b is None


# ------------------------------------------------------- equality with torch
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_torch_on_every_option_combination(dtype):
    """Every constructor option x every mask kind; the call options cycle so each meets every mask kind."""
    options = list(itertools.product((True, False), repeat=3))  # need_weights, average, unbatched
    seen = set()
    for i, cfg in enumerate(CONFIGS):
        theirs = torch_mha(i, dtype, **cfg)
        ours = MultiHeadAttention.from_torch(theirs)
        for j, (kpm_kind, am_kind) in enumerate(MASK_KINDS):
            if dtype == torch.float64 and i % 4:
                continue  # float64: a quarter of the configurations, every mask kind and call option
            need, average, unbatched = options[(i + 3 * j) % len(options)]
            args = qkv(theirs, unbatched=unbatched, seed=j)
            kpm, am = torch_style_masks(kpm_kind, am_kind, unbatched=unbatched, seed=j, dtype=dtype)
            kwargs = dict(key_padding_mask=kpm, attn_mask=am, need_weights=need, average_attn_weights=average)
            assert_same_call(ours, theirs, args, kwargs, dtype)
            seen.add((need, average, unbatched, kpm_kind, am_kind))
    assert {c[:3] for c in seen} == set(options) and {c[3:] for c in seen} == set(MASK_KINDS)
    assert dtype == torch.float64 or len(seen) == len(options) * len(MASK_KINDS)


def test_self_attention_fast_path_in_eval_matches_torch():
    theirs = torch_mha(3, batch_first=True).eval()  # torch takes its native fast path here
    ours = MultiHeadAttention.from_torch(theirs)
    x = qkv(theirs, lq=S)[0]
    kpm, _ = torch_style_masks("bool", "none")
    with torch.no_grad():
        assert_same_call(ours, theirs, (x, x, x), dict(key_padding_mask=kpm, need_weights=False), torch.float32)


def test_autocast_bfloat16_matches_torch():
    theirs = torch_mha(22, batch_first=True)
    ours = MultiHeadAttention.from_torch(theirs)
    q, k, v = qkv(theirs)
    kpm, _ = torch_style_masks("bool", "none")
    for args in ((q, k, v), (q.bfloat16(), k.bfloat16(), v.bfloat16())):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            (out_a, w_a), (out_b, w_b) = (m(*args, key_padding_mask=kpm) for m in (theirs, ours))
        assert out_b.dtype == out_a.dtype == torch.bfloat16
        torch.testing.assert_close(out_b, out_a, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(w_b, w_a, atol=2e-2, rtol=2e-2)


def test_backward_matches_torch():
    theirs = torch_mha(4, torch.float64, kv=True, add_bias_kv=True, add_zero_attn=True)
    ours = MultiHeadAttention.from_torch(theirs)
    kpm, am = torch_style_masks("bool", "bool3")
    grads = []
    for mod in (theirs, ours):
        args = [t.requires_grad_() for t in qkv(theirs)]
        out, w = mod(*args, key_padding_mask=kpm, attn_mask=am)
        (out.square().sum() + w.square().sum()).backward()
        grads.append([t.grad for t in args] + [p.grad for p in mod.parameters()])
    assert len(grads[0]) == len(grads[1]) == 3 + 8
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, **TOL[torch.float64])


# ------------------------------------------------------------- state_dict
@pytest.mark.parametrize("cfg", CONFIGS[::3], ids=str)
def test_state_dict_round_trips_both_ways(cfg):
    theirs = torch_mha(5, **cfg)
    ours = MultiHeadAttention(E, H, bias=cfg["bias"], add_bias_kv=cfg["add_bias_kv"],
                              add_zero_attn=cfg["add_zero_attn"], kdim=KDIM if cfg["kv"] else None,
                              vdim=VDIM if cfg["kv"] else None, batch_first=cfg["batch_first"])
    assert [(k, v.shape) for k, v in ours.state_dict().items()] == [
        (k, v.shape) for k, v in theirs.state_dict().items()]
    ours.load_state_dict(theirs.state_dict())  # torch -> attnkit
    back = torch_mha(6, **cfg)
    back.load_state_dict(ours.state_dict())  # attnkit -> torch
    for k, v in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[k], v) and torch.equal(back.state_dict()[k], v)
    args = qkv(theirs)
    torch.testing.assert_close(ours(*args)[0], back(*args)[0], **TOL[torch.float32])


@pytest.mark.parametrize("kwargs", [dict(), dict(kdim=KDIM, vdim=VDIM, add_bias_kv=True), dict(bias=False)], ids=str)
def test_seeded_initialisation_equals_torch(kwargs):
    torch.manual_seed(23)
    theirs = nn.MultiheadAttention(E, H, **kwargs)
    torch.manual_seed(23)
    ours = MultiHeadAttention(E, H, **kwargs)
    pairs = zip(theirs.state_dict().items(), ours.state_dict().items(), strict=True)
    assert all(ka == kb and torch.equal(a, b) for (ka, a), (kb, b) in pairs)


def test_from_torch_and_to_torch_keep_configuration_dtype_and_mode():
    theirs = torch_mha(7, torch.float64, kv=True, add_bias_kv=True, batch_first=True, dropout=0.25).eval()
    ours = MultiHeadAttention.from_torch(theirs)
    assert (ours.kdim, ours.vdim, ours.dropout, ours.batch_first, ours.training) == (KDIM, VDIM, 0.25, True, False)
    assert ours.out_proj.weight.dtype == torch.float64
    again = ours.to_torch()
    assert isinstance(again, nn.MultiheadAttention) and not again.training and again.batch_first
    for k, v in theirs.state_dict().items():
        assert torch.equal(again.state_dict()[k], v)
    with pytest.raises(DTypeError, match=r"module must be a torch\.nn\.MultiheadAttention"):
        MultiHeadAttention.from_torch(nn.Linear(2, 2))


def test_separate_projection_weights_load_into_packed_layout():
    src = torch_mha(8)
    sd = src.state_dict()
    w_q, w_k, w_v = sd.pop("in_proj_weight").chunk(3)
    sd.update(q_proj_weight=w_q, k_proj_weight=w_k, v_proj_weight=w_v)  # fairseq / HF layout
    ours = MultiHeadAttention(E, H)
    ours.load_state_dict(sd)
    assert torch.equal(ours.in_proj_weight, src.in_proj_weight)
    nested = nn.Sequential(MultiHeadAttention(E, H))
    nested.load_state_dict({f"0.{name}": t for name, t in sd.items()})
    assert torch.equal(nested[0].in_proj_weight, src.in_proj_weight) and "q_proj_weight" in sd  # caller's dict kept
    kv_module = MultiHeadAttention(E, H, kdim=KDIM, vdim=VDIM)
    with pytest.raises(RuntimeError, match=r"(?s)Missing key\(s\).*q_proj_weight.*Unexpected key\(s\).*in_proj_weight"):
        kv_module.load_state_dict(src.state_dict())  # as torch.nn.MultiheadAttention does
    result = kv_module.load_state_dict(src.state_dict(), strict=False)
    assert "q_proj_weight" in result.missing_keys and "in_proj_weight" in result.unexpected_keys


# --------------------------------------------------------- masks and causal
def test_is_causal_applies_a_causal_mask_without_attn_mask():
    theirs = torch_mha(9)
    ours = MultiHeadAttention.from_torch(theirs)
    x = qkv(theirs, s=L)[0]
    ignore_future = torch.ones(L, L, dtype=torch.bool).triu(1)
    out, w = ours(x, x, x, is_causal=True)
    ref, ref_w = theirs(x, x, x, attn_mask=ignore_future)
    torch.testing.assert_close(out, ref, **TOL[torch.float32])
    torch.testing.assert_close(w, ref_w, **TOL[torch.float32])
    assert bool((w[:, ignore_future] == 0).all())
    with pytest.raises(ArgumentError, match=r"is_causal=True .* L=5, S=7"):
        ours(*qkv(theirs), is_causal=True)


def test_is_causal_with_attn_mask_is_their_logical_and():
    theirs = torch_mha(10)
    ours = MultiHeadAttention.from_torch(theirs)
    x = qkv(theirs, s=L)[0]
    g = torch.Generator().manual_seed(0)
    am = torch.rand(L, L, generator=g) < 0.3
    am.fill_diagonal_(False)
    both = am | torch.ones(L, L, dtype=torch.bool).triu(1)
    assert not torch.equal(both, am)  # the AND must matter
    out, _ = ours(x, x, x, attn_mask=am, is_causal=True)
    torch.testing.assert_close(out, theirs(x, x, x, attn_mask=both)[0], **TOL[torch.float32])


def test_is_causal_hint_beside_a_float_causal_mask_and_bool_padding_matches_torch():
    """What torch's decoder layers pass: a float causal attn_mask, the is_causal hint, a bool padding mask."""
    theirs = torch_mha(23, batch_first=True)
    ours = MultiHeadAttention.from_torch(theirs)
    x = qkv(theirs, s=L)[0]
    causal = nn.Transformer.generate_square_subsequent_mask(L)
    kpm = torch.zeros(N, L, dtype=torch.bool)
    kpm[1, 3:] = True
    for need, average in ((False, True), (True, True), (True, False)):
        kwargs = dict(key_padding_mask=kpm, attn_mask=causal, is_causal=True, need_weights=need,
                      average_attn_weights=average)
        assert_same_call(ours, theirs, (x, x, x), kwargs, torch.float32)


def test_is_causal_hint_with_fewer_queries_than_keys_applies_attn_mask():
    """L != S: the attn_mask the hint describes applies (torch reads it, or the top-left causal mask it equals)."""
    theirs = torch_mha(24)
    ours = MultiHeadAttention.from_torch(theirs)
    ignore = torch.ones(L, S, dtype=torch.bool).triu(1)  # top-left causal, L=5 queries over S=7 keys
    for need in (False, True):
        assert_same_call(ours, theirs, qkv(theirs), dict(attn_mask=ignore, is_causal=True, need_weights=need),
                         torch.float32)


def test_attnkit_mask_keyword_has_attend_polarity():
    theirs = torch_mha(11, batch_first=True)
    ours = MultiHeadAttention.from_torch(theirs)
    q, k, v = qkv(theirs)
    lengths = torch.tensor([4, 6])
    pad = torch.arange(S)[None, :] >= lengths[:, None]  # torch: True = padding
    ref = theirs(q, k, v, key_padding_mask=pad)[0]
    torch.testing.assert_close(ours(q, k, v, mask=masks.padding(lengths))[0], ref, **TOL[torch.float32])
    torch.testing.assert_close(ours(q, k, v, mask=(~pad)[:, None, None, :])[0], ref, **TOL[torch.float32])
    causal = masks.causal(align="top_left")
    allowed = causal.materialize(L, S)[0, 0]
    both = ours(q, k, v, mask=causal, key_padding_mask=pad)[0]
    torch.testing.assert_close(both, theirs(q, k, v, attn_mask=~allowed, key_padding_mask=pad)[0],
                               **TOL[torch.float32])


def test_fully_masked_rows_give_zero_and_finite_gradients():
    theirs = torch_mha(12, torch.float64, batch_first=True)
    ours = MultiHeadAttention.from_torch(theirs)
    q, k, v = (t.requires_grad_() for t in qkv(theirs))
    kpm = torch.zeros(N, S, dtype=torch.bool)
    kpm[0] = True  # sample 0 has no key at all (an empty sentence)
    am = torch.zeros(L, S, dtype=torch.bool)
    am[2] = True  # query 2 may attend nothing, in every sample
    out, w = ours(q, k, v, key_padding_mask=kpm, attn_mask=am)
    assert bool(torch.isnan(theirs(q, k, v, key_padding_mask=kpm, attn_mask=am)[0][0]).all())  # torch: NaN
    bias = theirs.out_proj.bias.detach()
    assert torch.equal(out[0].detach(), bias.expand(L, E)) and torch.equal(out[1, 2].detach(), bias)
    assert bool((w[0] == 0).all()) and bool((w[1, 2] == 0).all())
    alone = ours(q[1:], k[1:], v[1:], key_padding_mask=kpm[1:], attn_mask=am)[0]
    torch.testing.assert_close(out[1], alone[0], **TOL[torch.float64])
    out.sum().backward()
    grads = [q.grad, k.grad, v.grad, *(p.grad for p in ours.parameters())]
    assert all(bool(torch.isfinite(g_).all()) for g_ in grads)
    assert bool((q.grad[0] == 0).all()) and bool((k.grad[0] == 0).all())


def test_float_mask_with_minus_inf_row_gives_zero_not_nan():
    ours = MultiHeadAttention.from_torch(torch_mha(13))
    args = qkv(ours)
    am = torch.zeros(L, S)
    am[1] = float("-inf")
    out, w = ours(*args, attn_mask=am)
    assert bool(torch.isfinite(out).all()) and bool((w[:, 1] == 0).all())
    assert torch.equal(out[1], ours.out_proj.bias.detach().expand(N, E))


# -------------------------------------------------- dropout and head weights
def test_dropout_only_in_training_and_weights_are_pre_dropout():
    ours = MultiHeadAttention.from_torch(torch_mha(14, dropout=0.5))
    plain = MultiHeadAttention.from_torch(torch_mha(14))
    args = qkv(ours)
    ours.eval()
    out1, w1 = ours(*args, average_attn_weights=False)
    out2, _ = ours(*args, average_attn_weights=False)
    assert torch.equal(out1, out2)
    torch.testing.assert_close(out1, plain(*args)[0], **TOL[torch.float32])
    ours.train()
    torch.manual_seed(0)
    out3, w3 = ours(*args, average_attn_weights=False)
    assert not torch.allclose(out3, out1, atol=1e-3)
    torch.testing.assert_close(w3, w1, **TOL[torch.float32])  # weights before dropout
    torch.testing.assert_close(w3.sum(-1), torch.ones(N, H, L), **TOL[torch.float32])
    torch.testing.assert_close(ours(*args)[1], w3.mean(1), **TOL[torch.float32])  # averaged as torch


# ---------------------------------------------------- grouped-query heads
def reference_mha(mod, query, key, value, allowed=None):
    """Float64 transcription of Sec. 3.2.2 with grouped heads; batch-first inputs, packed weights."""
    sd = {n: t.detach().double() for n, t in mod.state_dict().items()}
    d, hkv = mod.head_dim, mod.num_kv_heads
    w_q, w_k, w_v = sd["in_proj_weight"].split([E, hkv * d, hkv * d])
    b_q, b_k, b_v = sd["in_proj_bias"].split([E, hkv * d, hkv * d])
    out = []
    for b in range(query.shape[0]):
        heads = []
        for i in range(mod.num_heads):
            g = i // (mod.num_heads // hkv)
            rows, grp = slice(i * d, (i + 1) * d), slice(g * d, (g + 1) * d)
            q_i = query[b].double() @ w_q[rows].T + b_q[rows]
            k_g = key[b].double() @ w_k[grp].T + b_k[grp]
            v_g = value[b].double() @ w_v[grp].T + b_v[grp]
            scores = q_i @ k_g.T / math.sqrt(d)
            if allowed is not None:
                scores = scores.masked_fill(~allowed, float("-inf"))
            if "sinks" in sd:  # the head's sink: one more column of the softmax, its weight dropped
                scores = torch.cat([scores, sd["sinks"][i].expand(scores.shape[0], 1)], -1)
                heads.append(torch.softmax(scores, -1)[:, :-1] @ v_g)
                continue
            heads.append(torch.softmax(scores, -1) @ v_g)
        out.append(torch.cat(heads, -1) @ sd["out_proj.weight"].T + sd["out_proj.bias"])
    return torch.stack(out)


@pytest.mark.parametrize("num_kv_heads", [1, 3, 6])
def test_grouped_query_heads_match_transcription(num_kv_heads):
    torch.manual_seed(15)
    mod = MultiHeadAttention(E, 6, batch_first=True, num_kv_heads=num_kv_heads, dtype=torch.float64)
    with torch.no_grad():
        mod.in_proj_bias.normal_(0, 0.4)
    assert mod.in_proj_weight.shape == (E + 2 * num_kv_heads * 2, E)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(N, L, E, generator=g, dtype=torch.float64), torch.randn(N, S, E, generator=g,
                                                                                dtype=torch.float64)
    out, w = mod(q, k, k, average_attn_weights=False)
    assert w.shape == (N, 6, L, S)
    torch.testing.assert_close(out, reference_mha(mod, q, k, k), **TOL[torch.float64])
    causal = torch.ones(L, S, dtype=torch.bool).tril()
    torch.testing.assert_close(mod(q, k, k, mask=causal)[0], reference_mha(mod, q, k, k, causal),
                               **TOL[torch.float64])


def test_learned_sinks_match_transcription_train_and_decode():
    torch.manual_seed(16)
    mod = MultiHeadAttention(E, 6, batch_first=True, num_kv_heads=3, dtype=torch.float64, sinks=True)
    assert mod.sinks.shape == (6,) and not mod.sinks.any() and "sinks" in mod.state_dict()
    with torch.no_grad():
        mod.sinks.normal_(0, 2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, L, E, generator=g, dtype=torch.float64)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    out, _ = mod(x, x, x, is_causal=True)
    torch.testing.assert_close(out, reference_mha(mod, x, x, x, causal), **TOL[torch.float64])
    out.square().sum().backward()
    assert mod.sinks.grad is not None and mod.sinks.grad.abs().min() > 0
    cache = mod.new_cache(N, L)
    steps = torch.cat([mod.forward_step(x[:, :2], cache)[0]] + [mod.forward_step(x[:, i:i + 1], cache)[0]
                                                               for i in range(2, L)], 1)
    torch.testing.assert_close(steps, out, **TOL[torch.float64])
    with pytest.raises(ArgumentError, match="no attention sinks"):
        mod.to_torch()
    with torch.no_grad():
        mod.sinks.fill_(float("-inf"))  # a sink that takes nothing: plain softmax
    plain = MultiHeadAttention(E, 6, batch_first=True, num_kv_heads=3, dtype=torch.float64)
    plain.load_state_dict({n: t for n, t in mod.state_dict().items() if n != "sinks"})
    torch.testing.assert_close(mod(x, x, x)[0], plain(x, x, x)[0], **TOL[torch.float64])


def test_grouped_query_heads_cannot_become_torch():
    with pytest.raises(ArgumentError, match="num_heads=6, num_kv_heads=2"):
        MultiHeadAttention(E, 6, num_kv_heads=2).to_torch()


# ------------------------------------------------------------------ KV cache
def decode(mod, x, prefill, cache, *, need_weights=False):
    """Prefill ``prefill`` positions, then one position at a time; outputs concatenated along time."""
    t_dim = 0 if x.dim() == 2 or not mod.batch_first else 1
    steps = [(0, prefill)] + [(i, i + 1) for i in range(prefill, x.shape[t_dim])]
    outs = [mod.forward_step(x.narrow(t_dim, a, b - a), cache, need_weights=need_weights) for a, b in steps]
    return torch.cat([o for o, _ in outs], t_dim), [w for _, w in outs]


@pytest.mark.parametrize("cfg", [dict(), dict(add_bias_kv=True, add_zero_attn=True), dict(num_kv_heads=1),
                                 dict(batch_first=True, num_kv_heads=3, add_zero_attn=True), dict(unbatched=True)],
                         ids=str)
def test_kv_cache_decoding_equals_one_full_causal_pass(cfg):
    cfg = dict(cfg)
    unbatched = cfg.pop("unbatched", False)
    torch.manual_seed(16)
    mod = MultiHeadAttention(E, 6 if "num_kv_heads" in cfg else H, dtype=torch.float64, **cfg).eval()
    shape = (L + 2, E) if unbatched else (N, L + 2, E) if mod.batch_first else (L + 2, N, E)
    x = torch.randn(*shape, dtype=torch.float64)
    full, full_w = mod(x, x, x, is_causal=True)
    t = L + 2
    for prefill in (1, 3):
        cache = mod.new_cache(1 if unbatched else N, t)
        steps, weights = decode(mod, x, prefill, cache, need_weights=True)
        torch.testing.assert_close(steps, full, **TOL[torch.float64])
        assert len(cache) == t and len(weights) == t - prefill + 1
        for i, w in zip(range(prefill, t), weights[1:], strict=True):  # step i sees keys 0..i, then the extras
            assert w.shape[-2:] == (1, i + 1 + mod._n_extra)
            torch.testing.assert_close(w[..., 0, : i + 1], full_w[..., i, : i + 1], **TOL[torch.float64])
            torch.testing.assert_close(w[..., 0, i + 1 :], full_w[..., i, t:], **TOL[torch.float64])


def test_kv_cache_float32_decoding_close_to_full_pass():
    torch.manual_seed(17)
    mod = MultiHeadAttention(E, H, batch_first=True, num_kv_heads=1).eval()
    x = torch.randn(N, 9, E)
    with torch.no_grad():
        steps, _ = decode(mod, x, 2, mod.new_cache(N, 9))
        torch.testing.assert_close(steps, mod(x, x, x, is_causal=True, need_weights=False)[0],
                                   **TOL[torch.float32])


def test_kv_cache_stores_appended_keys_and_values_exactly():
    g = torch.Generator().manual_seed(0)
    cache = KVCache(N, 6, H, 4, v_head_dim=5)
    k1, v1 = torch.randn(N, H, 2, 4, generator=g), torch.randn(N, H, 2, 5, generator=g)
    k2, v2 = torch.randn(N, H, 3, 4, generator=g), torch.randn(N, H, 3, 5, generator=g)
    cache.append(k1, v1)
    keys, values = cache.append(k2, v2)
    assert torch.equal(keys, torch.cat([k1, k2], 2)) and torch.equal(values, torch.cat([v1, v2], 2))
    assert torch.equal(cache.keys, keys) and len(cache) == 5
    with pytest.raises(DTypeError, match=r"cache dtype torch\.float32; got torch\.float64"):
        cache.append(k1.double(), v1.double())
    with pytest.raises(ShapeError, match=r"kv_heads=3"):
        cache.append(k1[:, :1], v1[:, :1])


def test_kv_cache_overflow_raises_naming_capacity_and_requested_length():
    cache = KVCache(1, 4, 2, 3)
    cache.append(torch.zeros(1, 2, 3, 3), torch.zeros(1, 2, 3, 3))
    with pytest.raises(ShapeError, match=r"capacity 4 exceeded: 3 positions stored \+ 2 new = requested length 5"):
        cache.append(torch.zeros(1, 2, 2, 3), torch.zeros(1, 2, 2, 3))
    assert len(cache) == 3  # a refused append changes nothing
    mod = MultiHeadAttention(E, H, batch_first=True)
    small = mod.new_cache(N, 2)
    with pytest.raises(ShapeError, match="capacity 2"):
        mod.forward_step(torch.randn(N, 3, E), small)


def test_kv_cache_reset_restores_the_empty_state():
    torch.manual_seed(18)
    mod = MultiHeadAttention(E, H, batch_first=True, dtype=torch.float64).eval()
    x, other = torch.randn(2, N, 4, E, dtype=torch.float64)
    cache = mod.new_cache(N, 4)
    decode(mod, other, 1, cache)
    cache.reset()
    assert len(cache) == 0 and cache.keys.shape == (N, H, 0, 4)
    torch.testing.assert_close(decode(mod, x, 2, cache)[0], decode(mod, x, 2, mod.new_cache(N, 4))[0],
                               atol=0, rtol=0)


def test_kv_cache_gradients_equal_the_full_pass():
    torch.manual_seed(19)
    mod = MultiHeadAttention(E, H, batch_first=True, add_bias_kv=True, dtype=torch.float64)
    x = torch.randn(N, 4, E, dtype=torch.float64)
    grads = []
    for run in ("full", "steps"):
        mod.zero_grad()
        out = mod(x, x, x, is_causal=True)[0] if run == "full" else decode(mod, x, 1, mod.new_cache(N, 4))[0]
        out.square().sum().backward()
        grads.append([p.grad.clone() for p in mod.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(b, a, **TOL[torch.float64])


def test_forward_step_validates_its_cache():
    mod = MultiHeadAttention(E, H, batch_first=True)
    x = torch.randn(N, 1, E)
    with pytest.raises(ShapeError, match=r"\(batch, num_kv_heads, capacity, head_dim\) = \(2, 3, 4, 4\)"):
        mod.forward_step(x, KVCache(3, 4, H, 4))
    with pytest.raises(DTypeError, match="cache must be a KVCache"):
        mod.forward_step(x, None)
    with pytest.raises(ArgumentError, match="kdim == vdim == embed_dim"):
        MultiHeadAttention(E, H, kdim=KDIM).forward_step(x, KVCache(N, 4, H, 4))
    with pytest.raises(ArgumentError, match="capacity must be an int >= 0"):
        KVCache(N, -1, H, 4)


# ---------------------------------------------------------------- validation
@pytest.mark.parametrize("kwargs, match", [
    (dict(embed_dim=10, num_heads=3), "embed_dim must be divisible by num_heads; got embed_dim=10, num_heads=3"),
    (dict(embed_dim=12, num_heads=6, num_kv_heads=4), "num_kv_heads must divide num_heads"),
    (dict(embed_dim=12, num_heads=0), "num_heads must be a positive int"),
    (dict(embed_dim=12, num_heads=3, kdim=0), "kdim must be a positive int; got 0"),
    (dict(embed_dim=12, num_heads=3, dropout=1.0), "dropout must be a float in"),
])
def test_bad_construction_raises(kwargs, match):
    with pytest.raises(ArgumentError, match=match):
        MultiHeadAttention(**kwargs)


def test_a_mask_expression_as_text_points_to_parse():
    with pytest.raises(DTypeError, match=r"got str \(a mask expression is built with attnkit\.masks\.parse"):
        MultiHeadAttention(E, H, mask="causal()")


def test_bad_inputs_raise_errors_naming_the_argument():
    mod = MultiHeadAttention(E, H, kdim=KDIM, vdim=VDIM)
    q, k, v = qkv(mod)
    cases = [
        ((q[None], k, v), {}, ShapeError, "must all be 2-D"),
        ((q, k[0], v), {}, ShapeError, r"key \(2, 11\)"),
        ((q, k[:, :1], v[:, :1]), {}, ShapeError, "batch sizes .* differ"),
        ((q, v, v), {}, ShapeError, "key must have feature dim 11"),
        ((q, k, v[:-1]), {}, ShapeError, "key and value must have the same length"),
        ((q.double(), k, v), {}, DTypeError, "parameters' dtype torch.float32"),
        ((q, k, v), dict(key_padding_mask=torch.zeros(N, S, dtype=torch.long)), DTypeError,
         "key_padding_mask must be a bool tensor .* got torch.int64"),
        ((q, k, v), dict(attn_mask=torch.zeros(L, S, dtype=torch.uint8)), DTypeError,
         "attn_mask must be a bool tensor .* got torch.uint8"),
        ((q, k, v), dict(key_padding_mask=torch.zeros(S, N, dtype=torch.bool)), ShapeError,
         r"key_padding_mask must have shape \(2, 7\); got \(7, 2\)"),
        ((q, k, v), dict(attn_mask=torch.zeros(S, L, dtype=torch.bool)), ShapeError,
         r"attn_mask must have shape \(5, 7\) or \(6, 5, 7\); got \(7, 5\)"),
        ((q, k, v), dict(mask=torch.zeros(L, S)), DTypeError, "mask must be an attnkit.masks.Mask or a bool"),
        ((q, k, v), dict(mask=torch.ones(S, L, dtype=torch.bool)), ShapeError, "mask must broadcast"),
    ]
    for args, kwargs, err, match in cases:
        with pytest.raises(err, match=match):
            mod(*args, **kwargs)


def test_unbatched_masks_have_unbatched_shapes():
    mod = MultiHeadAttention.from_torch(torch_mha(20))
    q, k, v = qkv(mod, unbatched=True)
    with pytest.raises(ShapeError, match=r"key_padding_mask must have shape \(7,\); got \(2, 7\)"):
        mod(q, k, v, key_padding_mask=torch.zeros(N, S, dtype=torch.bool))
    with pytest.raises(ShapeError, match=r"\(3, 5, 7\)"):
        mod(q, k, v, attn_mask=torch.zeros(N * H, L, S, dtype=torch.bool))


# ----------------------------------------------------------------- gradcheck
def test_gradcheck_multihead_float64():
    torch.manual_seed(21)
    mod = MultiHeadAttention(4, 2, batch_first=True, add_bias_kv=True, add_zero_attn=True, kdim=3,
                             dtype=torch.float64, num_kv_heads=1)
    q, k, v = (torch.randn(2, n, d, dtype=torch.float64, requires_grad=True) for n, d in ((2, 4), (3, 3), (3, 4)))
    kpm = torch.tensor([[False, True, False], [True, True, True]])  # sample 1: every key is padding
    am = torch.tensor([[0.0, 0.5, -1.0], [0.25, float("-inf"), 0.0]])
    fn = lambda *t: mod(*t, key_padding_mask=kpm.float().masked_fill(kpm, float("-inf")), attn_mask=am)
    assert torch.autograd.gradcheck(lambda *t: fn(*t)[0], (q, k, v), fast_mode=True)
    fn = lambda *t: mod(*t, key_padding_mask=kpm, average_attn_weights=False)
    assert torch.autograd.gradcheck(lambda *t: fn(*t)[1], (q, k, v), fast_mode=True)


# -------------------------------------------------------- DotProductAttention
def dot_reference(q, k, v, scale, allowed=None):
    q, k, v = (t.double() for t in (q, k, v))
    group = q.shape[1] // k.shape[1] if q.dim() == 4 else 1
    if q.dim() == 4:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = q @ k.transpose(-1, -2) * scale
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize("scaled", [True, False])
def test_dot_product_module_matches_transcription(scaled):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(N, n, 11, generator=g, dtype=torch.float64) for n in (L, S, S))
    mod = DotProductAttention(scaled=scaled)
    scale = 1 / math.sqrt(11) if scaled else 1.0
    torch.testing.assert_close(mod(q, k, v), dot_reference(q, k, v, scale), **TOL[torch.float64])
    q4 = torch.randn(N, 6, L, 11, generator=g, dtype=torch.float64)
    k4, v4 = (torch.randn(N, 3, S, 11, generator=g, dtype=torch.float64) for _ in range(2))
    allowed = masks.causal().materialize(L, S)
    out, w = mod(q4, k4, v4, mask=masks.causal(), need_weights=True)
    torch.testing.assert_close(out, dot_reference(q4, k4, v4, scale, allowed), **TOL[torch.float64])
    assert w.shape == (N, 6, L, S) and bool((w[..., ~allowed[0, 0]] == 0).all())


def test_dot_product_module_dropout_gradcheck_and_ranks():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(N, H, n, 4, generator=g, dtype=torch.float64, requires_grad=True) for n in (3, 4, 4))
    mod = DotProductAttention(dropout=0.5)
    assert torch.autograd.gradcheck(lambda *t: mod.eval()(*t, mask=masks.causal()), (q, k, v), fast_mode=True)
    assert torch.equal(mod.eval()(q, k, v), mod(q, k, v))
    assert not torch.allclose(mod.train()(q, k, v), mod.eval()(q, k, v))
    with pytest.raises(ShapeError, match="q must be 3-D"):
        mod(q[0, 0], k[0, 0], v[0, 0])
    with pytest.raises(ArgumentError, match="dropout"):
        DotProductAttention(dropout=-0.1)


# ------------------------------------------------------------------ registry
@pytest.mark.parametrize("name, cls", [("multi-head", MultiHeadAttention), ("dot-product-module", DotProductAttention)])
def test_registry_entries_run(name, cls):
    entry = get(name)
    assert entry.target is cls and entry.family == "module" and "1706.03762" in entry.paper
    module, inputs = entry.example()
    out = module(*inputs)
    out = out[0] if isinstance(out, tuple) else out
    assert out.shape == inputs[0].shape and bool(torch.isfinite(out).all())


def test_core_tensor_mask_with_ragged_lengths():
    q, k = torch.randn(N, H, L, 4), torch.randn(N, H, S, 4)
    out = attnkit.attention(q, k, k, mask=masks.keys(torch.ones(N, S, dtype=torch.bool)))
    torch.testing.assert_close(out, attnkit.attention(q, k, k))


def test_attnkit_tensor_mask_of_the_wrong_key_length_is_a_shape_error():
    x = torch.randn(2, 5, 12)
    with pytest.raises(ShapeError, match="kv_len=4"):
        MultiHeadAttention(12, 3, batch_first=True)(x, x, x, mask=masks.keys(torch.ones(2, 4, dtype=torch.bool)))


@pytest.mark.parametrize(("kpm_kind", "am_kind"), [("float", "bool2"), ("bool", "float3")])
def test_masks_of_different_types_warn_as_torch_does_and_give_its_result(kpm_kind, am_kind):
    """RELIABILITY row 10: torch 2.13 accepts a key_padding_mask and an attn_mask of different dtypes with a
    deprecation warning, reading the bool one as -inf; so does the drop-in, naming both arguments and dtypes."""
    theirs = torch_mha(31)
    ours = MultiHeadAttention.from_torch(theirs)
    kpm, am = torch_style_masks(kpm_kind, am_kind)
    args = qkv(theirs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        expected = theirs(*args, key_padding_mask=kpm, attn_mask=am)
    assert any("mismatched key_padding_mask and attn_mask" in str(w.message) for w in caught)  # torch's own
    with pytest.warns(UserWarning, match=rf"key_padding_mask \({kpm.dtype}\) and attn_mask \({am.dtype}\)"):
        got = ours(*args, key_padding_mask=kpm, attn_mask=am)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, **TOL[torch.float32])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one mask, or two of one type: no warning
        ours(*args, key_padding_mask=kpm)
        ours(*args, key_padding_mask=kpm, attn_mask=torch_style_masks(kpm_kind, kpm_kind + "2")[1])


def test_a_key_padding_mask_keeps_the_call_on_torchs_kernel(monkeypatch):
    """The padding mask, wrapped for the extra keys, still reads as a key-only mask: the O(1) torch-sdpa rule."""
    from attnkit.kernels import dispatch
    ran = []
    execute = dispatch.execute
    monkeypatch.setattr(dispatch, "execute", lambda p, backend="auto": ran.append(execute(p, backend)[1].name)
                        or execute(p, backend))
    monkeypatch.setattr("attnkit.core.execute", dispatch.execute)
    monkeypatch.setattr(masks.Mask, "block_layout", lambda *a, **k: pytest.fail("a block layout was built"))
    m = MultiHeadAttention(32, 4, batch_first=True)
    x = torch.randn(2, 300, 32)
    pad = torch.zeros(2, 300, dtype=torch.bool)
    pad[1, 200:] = True
    m(x, x, x, key_padding_mask=pad, need_weights=False)
    assert ran and set(ran) == {"torch-sdpa"}


def test_forward_step_passes_one_causal_mask_object_to_every_step(monkeypatch):
    from attnkit.nn import multihead
    from attnkit.nn.kv_cache import CAUSAL

    seen = []
    real = multihead.attention
    monkeypatch.setattr(multihead, "attention", lambda *args, **kw: (seen.append(kw["mask"]), real(*args, **kw))[1])
    torch.manual_seed(0)
    mod = MultiHeadAttention(12, 3, batch_first=True).eval()
    x = torch.randn(2, 5, 12)
    cache = mod.new_cache(2, 5)
    steps = [mod.forward_step(x[:, :3], cache)[0]] + [mod.forward_step(x[:, i:i + 1], cache)[0] for i in (3, 4)]
    torch.testing.assert_close(torch.cat(steps, 1), mod(x, x, x, is_causal=True)[0], rtol=0, atol=1e-6)
    assert len(seen) == 4 and all(mask is CAUSAL for mask in seen[:3])  # seen[3]: the full pass


def test_head_dim_out_bias_and_scale_give_the_formula_with_narrow_or_wide_heads():
    """heads of head_dim features over another model width, W^O without bias, scores times ``scale``: the
    float64 formula written out here (softmax over causal keys, then the heads concatenated and W^O)."""
    torch.manual_seed(0)
    e, h, g, d, scale = 10, 4, 2, 6, 0.3
    mha = MultiHeadAttention(e, h, batch_first=True, num_kv_heads=g, head_dim=d, out_bias=False, scale=scale,
                             dtype=torch.float64).eval()
    assert mha.in_proj_weight.shape == (h * d + 2 * g * d, e) and mha.out_proj.weight.shape == (e, h * d)
    assert mha.out_proj.bias is None and mha.in_proj_bias is not None
    with torch.no_grad():
        mha.in_proj_bias.normal_()
    x = torch.randn(2, 5, e, dtype=torch.float64)
    wq, wk, wv = mha.in_proj_weight.split([h * d, g * d, g * d])
    bq, bk, bv = mha.in_proj_bias.split([h * d, g * d, g * d])
    q = (x @ wq.T + bq).unflatten(-1, (h, d))
    k = (x @ wk.T + bk).unflatten(-1, (g, d)).repeat_interleave(h // g, dim=2)
    v = (x @ wv.T + bv).unflatten(-1, (g, d)).repeat_interleave(h // g, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    s = s.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v).flatten(2) @ mha.out_proj.weight.T
    out, _ = mha(x, x, x, is_causal=True, need_weights=False)
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    cache = mha.new_cache(2, 5)
    steps = [mha.forward_step(x[:, :3], cache)[0], mha.forward_step(x[:, 3:], cache)[0]]
    torch.testing.assert_close(torch.cat(steps, 1), want, rtol=1e-12, atol=1e-12)
    with pytest.raises(ArgumentError, match=r"scale, heads narrower or wider than embed_dim \(head_dim=6\), out_bias"):
        MultiHeadAttention(e, h, head_dim=d, out_bias=False, scale=scale).to_torch()
    with pytest.raises(ArgumentError, match=r"scale must be None or a finite number > 0; got 0"):
        MultiHeadAttention(e, h, head_dim=d, scale=0)
    with pytest.raises(ArgumentError, match=r"head_dim must be a positive int; got 0"):
        MultiHeadAttention(e, h, head_dim=0)
    from attnkit.costing.analytic import cost

    with pytest.raises(ArgumentError, match=r"no cost formula here"):
        cost(mha)


def test_self_attention_projections_are_views_of_one_matmul_equal_to_each_heads_own_projection():
    """The packed projection splits into (B, H, L, d) queries and (B, Hkv, L, d) keys and values as views of the one
    matmul's output (no copies); each head equals x W_h^T + b_h computed alone, in float64."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(12, 4, num_kv_heads=2, batch_first=True, dtype=torch.float64)
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    q, k, v = mha._project(x, x, x)
    assert q.shape == (2, 4, 5, 3) and k.shape == v.shape == (2, 2, 5, 3)
    assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()
    w, b = mha.in_proj_weight, mha.in_proj_bias
    rows = [("q", q, 0, 4), ("k", k, 12, 2), ("v", v, 18, 2)]
    for _, got, start, heads in rows:
        for h in range(heads):
            lo = start + 3 * h
            want = x @ w[lo:lo + 3].T + b[lo:lo + 3]  # (B, L, d)
            torch.testing.assert_close(got[:, h], want, rtol=1e-12, atol=1e-12)
