"""Quantized storage in KVCache: codes and scales written on append, as the format quantizes the whole sequence."""

from __future__ import annotations

import itertools

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.errors import ArgumentError, DTypeError, ShapeError
from attnkit.functional.quantize import KVFormat
from attnkit.nn import KVCache
from tests.oracle import dense_attention


def _steps(cache, k, v, cuts):
    for a, b in itertools.pairwise(cuts):
        out = cache.append(k[:, :, a:b], v[:, :, a:b])
    return out


@pytest.mark.parametrize("kind", ["float8_e4m3", "float8_e5m2", "int8", "int4"])
def test_appending_in_steps_stores_the_codes_of_the_whole_sequence(kind):
    """Per (token, head) scales: a prefill and single steps store what quantizing all positions at once gives."""
    fmt = KVFormat(kind)
    k, v = torch.randn(2, 3, 9, 8), torch.randn(2, 3, 9, 8)
    cache = KVCache(2, 12, 3, 8, kv_format=kind)
    kc, vc = _steps(cache, k, v, [0, 5, 6, 7, 9])
    for codes, scale, x, name in ((kc, cache.scales["k_scale"], k, "k"), (vc, cache.scales["v_scale"], v, "v")):
        want_codes, want_scale = fmt.quantize(x)
        assert codes.dtype == fmt.storage_dtype and codes.view(torch.uint8).equal(want_codes.view(torch.uint8)), name
        assert scale.equal(want_scale), name
    assert len(cache) == 9 and cache.shape == (2, 3, 12, 8) and cache.dtype == torch.float32


def test_a_per_tensor_scale_is_fixed_by_the_first_append():
    cache = KVCache(1, 8, 1, 4, kv_format=KVFormat("int8", "tensor"))
    cache.append(torch.full((1, 1, 2, 4), 2.0), torch.ones(1, 1, 2, 4))
    assert cache.scales["k_scale"].item() == pytest.approx(2 / 127)
    kc, _ = cache.append(torch.full((1, 1, 1, 4), 5.0), torch.ones(1, 1, 1, 4))  # past amax: clamped
    assert kc[0, 0, 2].tolist() == [127] * 4 and cache.scales["k_scale"].item() == pytest.approx(2 / 127)
    cache.reset()
    assert cache.scales["k_scale"].item() == 1.0 and len(cache) == 0


def test_bytes_per_token_follow_the_format():
    bf16 = KVCache(1, 4, 8, 128, dtype=torch.bfloat16)
    assert bf16.bytes_per_token == 8 * 256 * 2
    fp8 = KVCache(1, 4, 8, 128, kv_format=KVFormat("float8_e4m3", "tensor"))
    assert fp8.bytes_per_token * 2 == bf16.bytes_per_token
    int4 = KVCache(1, 4, 8, 128, kv_format="int4")
    assert int4.bytes_per_token == bf16.bytes_per_token // 4 + 2 * 8 * 4
    assert int4.keys.shape == (1, 8, 0, 64) and int4.keys.element_size() * 64 * 4 * 8 == int4._k.numel()


def test_decoding_over_a_quantized_cache_equals_attention_over_its_dequantized_keys():
    """Grouped queries, a prefill then single steps; each output against the float64 oracle on the stored codes."""
    fmt = KVFormat("float8_e4m3")
    cache = KVCache(1, 20, 2, 8, kv_format=fmt)
    k, v, q = torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8), torch.randn(1, 4, 20, 8)
    for a, b in ((0, 12), (12, 13), (13, 14)):
        kc, vc = cache.append(k[:, :, a:b], v[:, :, a:b])
        out = attnkit.attention(q[:, :, a:b], kc, vc, mask=masks.causal(), **cache.scales)
        s = cache.scales
        kd = kc.double() * s["k_scale"].double()[..., None]
        vd = vc.double() * s["v_scale"].double()[..., None]
        want = dense_attention(q[:, :, a:b].double(), kd, vd, mask=masks.causal())
        torch.testing.assert_close(out.double(), want, rtol=0, atol=2e-6)


def test_bad_formats_and_inputs_name_the_argument():
    with pytest.raises(ArgumentError, match="kv_format must be a KVFormat or one of"):
        KVCache(1, 4, 1, 8, kv_format="fp8")
    with pytest.raises(DTypeError, match="kv_format"):
        KVCache(1, 4, 1, 8, kv_format=8)
    with pytest.raises(ShapeError, match="head_dim must be even"):
        KVCache(1, 4, 1, 7, kv_format="int4")
    cache = KVCache(1, 4, 1, 8, kv_format="int8")
    with pytest.raises(DTypeError, match="k"):
        cache.append(torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64))
    with pytest.raises(ShapeError, match="capacity 4 exceeded"):
        cache.append(torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5, 8))


def test_a_decoding_loop_grows_the_cache_in_place_in_its_preallocated_buffers():
    """Each step writes its positions into the buffers made at construction (no concatenation, no new buffer per
    token): the returned keys and values are views of those buffers, and after the steps they hold the sequence."""
    cache = KVCache(2, 12, 3, 4)
    buffers = (cache._k.data_ptr(), cache._v.data_ptr())
    ks, vs = torch.randn(2, 3, 9, 4), torch.randn(2, 3, 9, 4)
    with torch.no_grad():
        k, v = cache.append(ks[:, :, :5], vs[:, :, :5])  # a prompt, then one position a step
        for i in range(5, 9):
            k, v = cache.append(ks[:, :, i:i + 1], vs[:, :, i:i + 1])
            assert (k.data_ptr(), v.data_ptr()) == buffers and k.shape == (2, 3, i + 1, 4)
    assert (cache._k.data_ptr(), cache._v.data_ptr()) == buffers and len(cache) == 9
    assert torch.equal(k, ks) and torch.equal(v, vs) and not cache._k[:, :, 9:].any()
