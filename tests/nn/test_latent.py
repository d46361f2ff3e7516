"""MultiHeadLatentAttention: DeepSeek-V2 eqs. 9-19 transcribed in float64; the absorbed form equals the naive one.

The reference below follows the paper's equations token by token and head by head with loops
(RMSNorm after each down-projection, as V3; interleaved RoPE on the decoupled parts), sharing
no code with the module. The two forms agree to 1e-10 in float64 on a prefill and 16 decode
steps against the latent cache, which holds ``kv_lora_rank + qk_rope_head_dim`` values a token.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.autograd import gradcheck

from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.nn.kv_cache import KVCache, LatentCache
from attnkit.nn.latent import MultiHeadLatentAttention
from attnkit.registry import get
from tests.helpers import randomized_float64

B, N, DIM, H = 2, 5, 14, 3
RANK, Q_RANK, NOPE, ROPE, DV = 7, 9, 4, 6, 5


def _module(q_rank=Q_RANK, *, causal=True):
    mla = MultiHeadLatentAttention(DIM, H, kv_lora_rank=RANK, q_lora_rank=q_rank, qk_nope_head_dim=NOPE,
                                   qk_rope_head_dim=ROPE, v_head_dim=DV, causal=causal, bias=True,
                                   rotary={"base": 30.0})
    return randomized_float64(mla).eval()


def _x(n=N, seed=1):
    return torch.randn(B, n, DIM, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _rms(v, weight):
    return v / math.sqrt(float((v * v).mean()) + 1e-6) * weight


def _rope(v, m, base=30.0):
    out = v.clone()
    for i in range(len(v) // 2):
        angle = m * base ** (-2 * i / len(v))
        out[2 * i] = v[2 * i] * math.cos(angle) - v[2 * i + 1] * math.sin(angle)
        out[2 * i + 1] = v[2 * i + 1] * math.cos(angle) + v[2 * i] * math.sin(angle)
    return out


@torch.no_grad()
def reference(m, x, keep=None):
    """u_t = W^O [o_t,1; ...] with o_t,i = sum_j softmax_j(q_t,i . k_j,i / sqrt(d_h + d_h^R)) v_j,i (eqs. 9-19)."""
    def linear(layer, v):
        return layer.weight @ v + (layer.bias if layer.bias is not None else 0)

    out = torch.zeros(B, x.shape[1], DIM, dtype=torch.float64)
    for b in range(B):
        c, k_r, q_c, q_r = [], [], [], []
        for t in range(x.shape[1]):
            h_t = x[b, t]
            down = linear(m.kv_down, h_t)
            c.append(_rms(down[:RANK], m.kv_norm.weight))  # eq. 9 (+ V3's RMSNorm)
            k_r.append(_rope(down[RANK:], t))  # eq. 14
            cq = h_t if m.q_lora_rank is None else _rms(linear(m.q_down, h_t), m.q_norm.weight)  # eq. 12
            q = linear(m.q_proj if m.q_lora_rank is None else m.q_up, cq).reshape(H, NOPE + ROPE)
            q_c.append(q[:, :NOPE])  # eq. 13
            q_r.append(torch.stack([_rope(q[i, NOPE:], t) for i in range(H)]))  # eq. 15
        up = [(m.kv_up.weight @ cj).reshape(H, NOPE + DV) for cj in c]  # eqs. 10-11
        for t in range(x.shape[1]):
            heads = []
            for i in range(H):
                seen = [j for j in range(x.shape[1]) if (j <= t or not m.causal) and (keep is None or keep[b, j])]
                s = [(float(q_c[t][i] @ up[j][i, :NOPE]) + float(q_r[t][i] @ k_r[j])) / math.sqrt(NOPE + ROPE)
                     for j in seen]  # eqs. 16-18
                top = max(s)
                e = [math.exp(v - top) for v in s]
                heads.append(sum(e[a] / sum(e) * up[j][i, NOPE:] for a, j in enumerate(seen)))
            out[b, t] = linear(m.out_proj, torch.cat(heads))  # eq. 19
    return out


@pytest.mark.parametrize("q_rank", [Q_RANK, None])
@pytest.mark.parametrize("form", ["naive", "absorbed"])
def test_both_forms_equal_the_papers_equations(q_rank, form):
    mla = _module(q_rank)
    x = _x()
    torch.testing.assert_close(mla(x, form=form), reference(mla, x), rtol=0, atol=1e-12)


def test_bidirectional_with_padding():
    mla = _module(causal=False)
    x, keep = _x(), torch.tensor([[True] * 5, [True, True, False, True, False]])
    for form in ("naive", "absorbed"):
        out = mla(x, key_keep_mask=keep, form=form)
        torch.testing.assert_close(out, reference(mla, x, keep), rtol=0, atol=1e-12)


def test_absorbed_equals_naive_on_a_prefill_and_16_decode_steps():
    mla = _module()
    x = _x(n=N + 16, seed=3)
    caches = {form: mla.new_cache(B, N + 16) for form in ("naive", "absorbed")}
    steps = {form: [mla(x[:, :N], cache=caches[form], form=form)] for form in caches}
    for i in range(N, N + 16):
        for form in caches:
            steps[form].append(mla(x[:, i:i + 1], cache=caches[form], form=form))
    naive, absorbed = (torch.cat(steps[form], 1) for form in ("naive", "absorbed"))
    torch.testing.assert_close(absorbed, naive, rtol=0, atol=1e-10)
    torch.testing.assert_close(naive, mla(x), rtol=0, atol=1e-10)  # and both equal one full pass
    assert not torch.allclose(naive[:, N:], mla(x[:, N:]), atol=1e-3)  # the cache is read


def test_the_cache_holds_the_latent_and_the_rotated_key_only():
    mla = _module()
    cache = mla.new_cache(B, 8)
    assert isinstance(cache, LatentCache) and isinstance(cache, KVCache)
    assert cache.shape == (B, 1, 8, RANK + ROPE) and cache.values.shape[-1] == 0
    x = _x()
    mla(x, cache=cache)
    stored = sum(t.numel() for t in (cache._k, cache._v)) // (B * cache.capacity)
    assert stored == RANK + ROPE  # per token, for every head together
    latent, rope = mla.kv_down(x).split([RANK, ROPE], -1)
    torch.testing.assert_close(cache.latent[:, 0], mla.kv_norm(latent), rtol=0, atol=0)
    torch.testing.assert_close(cache.rope_keys, mla.rotary.rotate(rope[:, None]), rtol=0, atol=0)
    with pytest.raises(ShapeError, match="capacity 8 exceeded"):
        mla(_x(n=4), cache=cache)


def test_gradients_in_both_forms():
    mla = _module()
    small = _x()[:, :3].requires_grad_()
    for form in ("naive", "absorbed"):
        assert gradcheck(lambda t, f=form: mla(t, form=f), (small,))
    mla(_x(), form="absorbed").sum().backward()
    for name, p in mla.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_errors():
    mla = _module()
    with pytest.raises(ArgumentError, match="form must be one of"):
        mla(_x(), form="fast")
    with pytest.raises(DTypeError, match="cache must be a LatentCache"):
        mla(_x(), cache=KVCache(B, 8, 1, RANK + ROPE))
    with pytest.raises(ArgumentError, match="kv_lora_rank must be an int >= 1"):
        MultiHeadLatentAttention(DIM, H, kv_lora_rank=0, qk_rope_head_dim=2, qk_nope_head_dim=2)
    with pytest.raises(ShapeError, match="key_keep_mask"):
        mla(_x(), key_keep_mask=torch.ones(B, N + 1, dtype=torch.bool))


def test_registry_entry_and_cache_bytes():
    entry = get("multi-head-latent")
    fn, inputs = entry.example()
    assert fn(*inputs).shape == inputs[0].shape
    c = entry.cost(dtype="bfloat16")
    assert c.state_per_token == (8 + 4) * 2 and "growing per token (a KV cache)" in c.table()
    at_scale = entry.cost(q_len=4096)  # the layer's 8 heads of 64: d_c = 256, d_h^R = 32 (DeepSeek-V2's ratios)
    assert (at_scale.sizes["kv_lora_rank"], at_scale.sizes["qk_rope_head_dim"]) == (256, 32)
    assert at_scale.state_per_token == (256 + 32) * 4


@pytest.mark.parametrize("kind", ["float8_e4m3", "int8"])
def test_a_quantized_latent_cache_decodes_the_same_in_both_forms(kind):
    """The absorbed form reads the codes through attention (k_scale = v_scale = the rows' scales, one key block
    at a time); the naive form dequantizes the rows and decompresses them: float64, the same within 1e-10."""
    from attnkit.functional.quantize import KVFormat

    mla = _module()
    x = _x(n=N + 6, seed=4)
    caches = {form: mla.new_cache(B, N + 6, kv_format=kind) for form in ("naive", "absorbed")}
    steps = {form: [mla(x[:, :N], cache=caches[form], form=form)] for form in caches}
    for i in range(N, N + 6):
        for form in caches:
            steps[form].append(mla(x[:, i:i + 1], cache=caches[form], form=form))
    naive, absorbed = (torch.cat(steps[form], 1) for form in ("naive", "absorbed"))
    torch.testing.assert_close(absorbed, naive, rtol=0, atol=1e-10)
    cache = caches["absorbed"]
    assert cache.keys.dtype == KVFormat(kind).storage_dtype and cache.scales["v_scale"].equal(cache.scales["k_scale"])
    full = mla(x)
    gap = (naive - full).abs().max().item()
    assert 0 < gap < 0.1 * full.abs().max().item()  # the codes are read: close to, not equal to, full precision
    assert cache.bytes_per_token == (RANK + ROPE) * 1 + 4  # one byte a feature, one float32 scale a row


def test_an_int4_latent_cache_needs_an_even_rank():
    with pytest.raises(ShapeError, match="kv_lora_rank must be even"):
        LatentCache(1, 4, 7, 5, kv_format="int4")
