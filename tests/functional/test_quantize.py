"""Quantized keys and values: the formats' codes and scales, and attention over codes on every path that reads them.

The oracle dequantizes with its own arithmetic (:func:`_decode`, not the library's) and runs the float64
dense attention of :mod:`tests.oracle` on the result.
"""

from __future__ import annotations

import pytest
import torch

import attnkit
from attnkit import masks
from attnkit.errors import ArgumentError, BackendError, DTypeError, ShapeError
from attnkit.functional import quantize
from attnkit.functional.quantize import KINDS, KVFormat, dequantize
from attnkit.nn import PagedKVCache
from tests.oracle import dense_attention

FORMATS = [KVFormat(kind, g) for kind in KINDS for g in ("token_head", "tensor")]
ids = [f"{f.kind}-{f.granularity}" for f in FORMATS]


def _decode(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """code * scale in float64, int4 nibbles read by integer division (the library masks and shifts)."""
    if codes.dtype == torch.uint8:
        c = codes.to(torch.int64)
        low, high = c % 16, c // 16
        signed = torch.stack([torch.where(n > 7, n - 16, n) for n in (low, high)], -1).flatten(-2)
        values = signed.to(torch.float64)
    else:
        values = codes.to(torch.float64)
    s = scale.to(torch.float64)
    return values * (s if s.dim() == 0 else s.unsqueeze(-1))


@pytest.mark.parametrize("fmt", FORMATS, ids=ids)
def test_codes_round_to_within_half_a_step_of_the_input(fmt):
    x = torch.randn(2, 3, 7, 16) * torch.rand(2, 3, 7, 1) * 5
    codes, scale = fmt.quantize(x)
    assert codes.dtype == fmt.storage_dtype
    assert codes.shape[-1] == 16 // fmt.per_element
    amax = x.abs().amax() if fmt.granularity == "tensor" else x.abs().amax(-1)
    torch.testing.assert_close(scale, amax / fmt.qmax)
    x_hat = _decode(codes, scale)
    torch.testing.assert_close(dequantize(codes, scale, torch.float64), x_hat, rtol=0, atol=0)
    s = scale.to(torch.float64) if scale.dim() == 0 else scale.to(torch.float64)[..., None]
    err = (x_hat - x.double()).abs()
    if fmt.kind.startswith("int"):
        assert bool((err <= s / 2 + 1e-6 * s).all())  # round to nearest: half a step
    else:  # float8: a relative step of 2^-3 (e4m3) or 2^-2 (e5m2) at most, or the subnormal step
        mantissa = 3 if fmt.kind == "float8_e4m3" else 2
        sub = 2.0 ** (-9 if fmt.kind == "float8_e4m3" else -16)
        assert bool((err <= x.double().abs() * 2.0 ** -(mantissa + 1) + s * sub).all())


def test_int4_packs_two_features_per_byte_low_nibble_first():
    fmt = KVFormat("int4", "tensor")
    x = torch.tensor([[7.0, -7.0, 1.0, -1.0]])
    codes, scale = fmt.quantize(x)
    assert scale.item() == 1.0
    assert codes.tolist() == [[0x97, 0xF1]]  # (7, -7 = 0x9), (1, -1 = 0xF)
    assert dequantize(codes, scale).tolist() == x.tolist()


def test_a_row_of_zeros_gets_scale_one_and_decodes_to_zeros():
    codes, scale = KVFormat("int8").quantize(torch.zeros(2, 4))
    assert scale.tolist() == [1.0, 1.0] and dequantize(codes, scale).abs().sum() == 0


def test_bytes_per_token_are_those_of_the_format():
    heads, d = 8, 128
    bf16 = heads * 2 * d * 2
    assert KVFormat("float8_e4m3", "tensor").bytes_per_token(heads, d) * 2 == bf16
    assert KVFormat("float8_e5m2", "token_head").bytes_per_token(heads, d) == bf16 // 2 + 2 * heads * 4
    assert KVFormat("int4", "tensor").bytes_per_token(heads, d) * 4 == bf16
    assert KVFormat("int4").bytes_per_token(heads, d) == bf16 // 4 + 2 * heads * 4
    assert KVFormat("int8").bytes_per_token(heads, d, 64) == heads * (d + 64) + 2 * heads * 4


def test_bad_formats_are_refused_by_name():
    with pytest.raises(ArgumentError, match="kind"):
        KVFormat("fp4")
    with pytest.raises(ArgumentError, match="granularity"):
        KVFormat("int8", "channel")
    with pytest.raises(ShapeError, match="head_dim must be even"):
        KVFormat("int4").bytes_per_token(2, 5)
    with pytest.raises(ArgumentError, match="kv_format"):
        quantize.as_format("KVCache", "fp8")


def _quantized(fmt, *shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return fmt.quantize(torch.randn(*shape, generator=g))


def _oracle(q, k_codes, k_scale, v_codes, v_scale, **kwargs):
    return dense_attention(q.double(), _decode(k_codes, k_scale), _decode(v_codes, v_scale), **kwargs)


MASKS = {"causal": masks.causal(), "window": masks.sliding_window(40, 0) & masks.causal()}


@pytest.mark.parametrize("fmt", FORMATS, ids=ids)
@pytest.mark.parametrize("lq", [1, 37], ids=["decode", "chunked-prefill"])
@pytest.mark.parametrize("mask", list(MASKS), ids=list(MASKS))
def test_attention_over_codes_equals_attention_over_the_dequantized_tensors(fmt, lq, mask):
    """Grouped queries (4 heads over 2) and sinks; Lk = 1200 keys, read in blocks of at most 512.

    float64 queries dequantize in float64: the float64 oracle within 1e-12; float32 queries: attention over
    the dequantized float32 tensors within 1e-6 (and the oracle within float32's rounding)."""
    q = torch.randn(2, 4, lq, 16, generator=torch.Generator().manual_seed(1))
    (kc, ks), (vc, vs) = _quantized(fmt, 2, 2, 1200, 16), _quantized(fmt, 2, 2, 1200, 16, seed=2)
    sinks, m = torch.randn(4), MASKS[mask]
    want = _oracle(q, kc, ks, vc, vs, mask=m, sinks=sinks.double())
    exact = attnkit.attention(q.double(), kc, vc, k_scale=ks, v_scale=vs, mask=m, sinks=sinks.double())
    torch.testing.assert_close(exact, want, rtol=0, atol=1e-12)
    out = attnkit.attention(q, kc, vc, k_scale=ks, v_scale=vs, mask=m, sinks=sinks)
    assert out.dtype == torch.float32
    dense = attnkit.attention(q, _decode(kc, ks).float(), _decode(vc, vs).float(), mask=m, sinks=sinks)
    torch.testing.assert_close(out, dense, rtol=0, atol=1e-6)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-5)
    assert attnkit.explain(q, kc, vc, k_scale=ks, v_scale=vs, mask=m, sinks=sinks).path == "online-softmax"


def test_each_key_block_is_dequantized_alone(monkeypatch):
    """The loop dequantizes blocks of at most 512 keys: never the 1200 keys of the cache at once."""
    seen = []
    real = quantize.dequantize

    def spy(codes, scale, dtype=torch.float32):
        seen.append(codes.shape[2])
        return real(codes, scale, dtype)

    monkeypatch.setattr(quantize, "dequantize", spy)
    fmt = KVFormat("int8")
    q = torch.randn(1, 2, 1, 16)
    (kc, ks), (vc, vs) = _quantized(fmt, 1, 2, 1200, 16), _quantized(fmt, 1, 2, 1200, 16, seed=3)
    attnkit.attention(q, kc, vc, k_scale=ks, v_scale=vs, mask=masks.causal())
    assert seen and max(seen) <= 512 and sum(seen) == 2 * 1200


def _sequence(pool, scale, page, lane):
    """A sequence's codes ``(H_kv, n, E)`` and scales read from its pages and lanes by plain indexing."""
    return pool[page, lane].transpose(0, 1), scale if scale.dim() == 0 else scale[page, lane].transpose(0, 1)


@pytest.mark.parametrize("fmt", [KVFormat("float8_e4m3"), KVFormat("int4"), KVFormat("int8", "tensor")],
                         ids=["fp8", "int4", "int8-tensor"])
def test_a_quantized_paged_cache_equals_each_sequence_dequantized_alone(fmt):
    """Permuted pages (a fork written after the parent), grouped queries, sinks, causal chunked prefill."""
    cache = PagedKVCache(96, 16, 2, 16, kv_format=fmt)
    g = torch.Generator().manual_seed(4)
    first = cache.allocate()
    cache.append(first, torch.randn(2, 600, 16, generator=g), torch.randn(2, 600, 16, generator=g))
    second = cache.fork(first)
    cache.append(second, torch.randn(2, 5, 16, generator=g), torch.randn(2, 5, 16, generator=g))
    third = cache.allocate()
    cache.append(third, torch.randn(2, 30, 16, generator=g), torch.randn(2, 30, 16, generator=g))
    q, sinks = torch.randn(3, 4, 3, 16, generator=g), torch.randn(4, generator=g)
    seqs = [first, second, third]
    out = cache.attend(seqs, q, sinks=sinks)
    assert attnkit.explain(q, cache.k_pages, cache.v_pages, block_table=cache.block_table(seqs),
                           seqused_k=cache.lengths(seqs), mask=masks.causal(), **cache.scales).path == "paged-split-kv"
    scales = cache.scales
    for row, seq in enumerate(seqs):
        n = cache.length(seq)
        pages = cache.block_table([seq])[0]
        pos = torch.arange(n)
        page, lane = pages[pos // 16], pos % 16

        k, v = (_sequence(pool, scale, page, lane) for pool, scale in ((cache.k_pages, scales["k_scale"]),
                                                                       (cache.v_pages, scales["v_scale"])))
        want = _oracle(q[row:row + 1], k[0][None], k[1][None], v[0][None], v[1][None], mask=masks.causal(),
                       sinks=sinks.double())
        torch.testing.assert_close(out[row:row + 1].double(), want, rtol=0, atol=2e-6)


def test_a_contiguous_cache_with_seqused_k_reads_codes_chunk_by_chunk():
    fmt = KVFormat("float8_e5m2")
    (kc, ks), (vc, vs) = _quantized(fmt, 2, 1, 700, 8), _quantized(fmt, 2, 1, 700, 8, seed=5)
    q, used = torch.randn(2, 2, 1, 8), torch.tensor([700, 333])
    out = attnkit.attention(q, kc, vc, k_scale=ks, v_scale=vs, seqused_k=used, mask=masks.causal())
    for b in range(2):
        n = int(used[b])
        want = _oracle(q[b:b + 1], kc[b:b + 1, :, :n], ks[b:b + 1, :, :n], vc[b:b + 1, :, :n], vs[b:b + 1, :, :n],
                       mask=masks.causal())
        torch.testing.assert_close(out[b:b + 1].double(), want, rtol=0, atol=2e-6)


def test_explain_names_the_format_and_why_the_dense_paths_step_aside():
    fmt = KVFormat("float8_e4m3")
    (kc, ks), (vc, vs) = _quantized(fmt, 1, 2, 64, 8), _quantized(fmt, 1, 2, 64, 8)
    text = str(attnkit.explain(torch.randn(1, 2, 1, 8), kc, vc, k_scale=ks, v_scale=vs))
    assert "kv format: float8_e4m3 (per (token, head) scales)" in text
    assert "torch-sdpa            refused: reads full-precision keys and values" in text


def test_bad_quantized_inputs_get_errors_naming_the_argument():
    fmt = KVFormat("int8")
    q = torch.randn(1, 2, 1, 8)
    (kc, ks), (vc, vs) = _quantized(fmt, 1, 2, 10, 8), _quantized(fmt, 1, 2, 10, 8)
    with pytest.raises(DTypeError, match=r"key has dtype torch.int8.*pass k_scale"):
        attnkit.attention(q, kc, vc)
    with pytest.raises(ArgumentError, match="v_scale=None"):
        attnkit.attention(q, kc, vc, k_scale=ks)
    with pytest.raises(ShapeError, match=r"k_scale must have shape \(\) .* \(1, 2, 10\).*got \(1, 2, 9\)"):
        attnkit.attention(q, kc, vc, k_scale=ks[..., :9], v_scale=vs)
    with pytest.raises(DTypeError, match=r"v_scale must be a float32 tensor; got dtype torch\.float16"):
        attnkit.attention(q, kc, vc, k_scale=ks, v_scale=vs.half())
    with pytest.raises(DTypeError, match="with k_scale and v_scale, key must hold codes"):
        attnkit.attention(q, torch.randn(1, 2, 10, 8), vc, k_scale=ks, v_scale=vs)
    with pytest.raises(DTypeError, match="key and value codes must share a dtype"):
        attnkit.attention(q, kc, vc.to(torch.float8_e4m3fn), k_scale=ks, v_scale=vs)
    with pytest.raises(ShapeError, match="D=32, int4 codes packed"):
        codes, scale = KVFormat("int4").quantize(torch.randn(1, 2, 10, 32))
        attnkit.attention(q, codes, codes, k_scale=scale, v_scale=scale)
    with pytest.raises(BackendError, match="reads full-precision keys and values"):
        attnkit.attention(q, kc, vc, k_scale=ks, v_scale=vs, backend="sdpa")
    with pytest.raises(BackendError, match="return_weights"):
        attnkit.attention(q, kc, vc, k_scale=ks, v_scale=vs, return_weights=True)
