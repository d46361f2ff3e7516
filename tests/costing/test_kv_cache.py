"""analysis.cost.kv_cache: decoding-cache bytes per token of MHA, GQA, MQA and MLA, from the registry's specs.

DeepSeek-V2's Table 1 (arXiv:2405.04434) gives the elements per token and layer: MHA
2 n_h d_h, GQA 2 n_g d_h, MQA 2 d_h, MLA d_c + d_h^R (= 4.5 d_h at its ratios). The rows must
equal those formulas and what the modules' own caches hold.
"""

from __future__ import annotations

import pytest
import torch

from attnkit.costing.analytic import cost
from attnkit.costing.kv_cache import kv_cache_rows, kv_cache_table
from attnkit.errors import ArgumentError
from attnkit.nn import MultiHeadAttention, MultiHeadLatentAttention


def test_rows_follow_deepseek_v2_table_1():
    n_h, d_h = 12, 16
    rows = {r.label: r for r in kv_cache_rows(heads=n_h, head_dim=d_h, dtype="bfloat16")}
    assert [rows[k].values for k in ("MHA", "GQA", "MQA", "MLA")] == [2 * n_h * d_h, 2 * 3 * d_h, 2 * d_h,
                                                                     4 * d_h + d_h // 2]
    assert all(r.bytes == 2 * r.values for r in rows.values())
    assert rows["GQA"].setting == "kv_heads=3" and "kv_lora_rank=64" in rows["MLA"].setting
    assert {r.label: r.values for r in kv_cache_rows(heads=n_h, head_dim=d_h, kv_heads=6)}["GQA"] == 2 * 6 * d_h


def test_rows_are_what_the_modules_caches_hold():
    mha = MultiHeadAttention(24, 6, num_kv_heads=2, batch_first=True)
    cache = mha.new_cache(1, 10)
    held = (cache._k.numel() + cache._v.numel()) // 10
    assert cost(mha, batch=1, q_len=1).state_per_token == 4 * held
    mla = MultiHeadLatentAttention(24, 3, kv_lora_rank=7, qk_rope_head_dim=2, qk_nope_head_dim=4)
    latent = mla.new_cache(1, 10, dtype=torch.float16)
    assert (latent._k.numel() + latent._v.numel()) // 10 * 2 == cost(mla, batch=1, length=1,
                                                                     dtype="float16").state_per_token


def test_table_and_errors():
    text = kv_cache_table(heads=8, head_dim=64, tokens=1000)
    lines = text.splitlines()
    assert lines[0].startswith("KV-cache per token and layer: 8 heads of 64 features")
    assert [line.split()[0] for line in lines[2:6]] == ["MHA", "GQA", "MQA", "MLA"]
    assert lines[2].split()[-1] == "1.000" and "1000 tokens" in lines[1]
    with pytest.raises(ArgumentError, match="kv_heads must divide heads"):
        kv_cache_rows(heads=8, kv_heads=3)
    with pytest.raises(ArgumentError, match="dtype must be one of"):
        kv_cache_rows(dtype="int8")
    assert cost("retnet").state_per_token == 0 < cost("retnet").state_fixed  # a recurrent state, no KV cache


@pytest.mark.parametrize(("heads", "head_dim"), [(10**5, 10**4), (10**6, 10**6), (12, 10**12)])
def test_huge_layers_are_priced_by_formula_without_a_pass_over_stand_in_inputs(heads, head_dim):
    # A pass over the zero-stride stand-ins (the dispatcher's finiteness check) grew with heads x head_dim:
    # over 100 s at 10^7. The rows are formulas: exact at any size, at once.
    import time

    start = time.perf_counter()
    rows = {r.label: r for r in kv_cache_rows(heads=heads, head_dim=head_dim)}
    assert time.perf_counter() - start < 5  # seconds, on a busy machine; the formula takes milliseconds
    assert [rows[k].values for k in ("MHA", "MQA", "MLA")] == [2 * heads * head_dim, 2 * head_dim,
                                                              4 * head_dim + head_dim // 2]


def test_bytes_per_token_per_format_are_those_a_quantized_cache_stores():
    """fp8 is half of bfloat16, int4 a quarter, plus two float32 scales per (token, head); as KVCache counts."""
    from attnkit.costing.kv_cache import kv_format_rows
    from attnkit.nn import KVCache

    rows = {r.format: r for r in kv_format_rows(heads=8, head_dim=64, kv_heads=2, dtype="bfloat16")}
    bf16 = rows["bfloat16"]
    assert (bf16.mha, bf16.gqa, bf16.mqa) == (2 * 8 * 64 * 2, 2 * 2 * 64 * 2, 2 * 64 * 2)
    assert rows["float8_e4m3 (per tensor scales)"].mha * 2 == bf16.mha
    assert rows["int4 (per tensor scales)"].gqa * 4 == bf16.gqa
    assert rows["int4 (per (token, head) scales)"].mqa == bf16.mqa // 4 + 2 * 4
    assert rows["float8_e5m2 (per (token, head) scales)"].ratio == pytest.approx((1024 + 64) / 2048)
    for kind in ("float8_e4m3", "int8", "int4"):
        cache = KVCache(1, 1, 2, 64, kv_format=kind)
        assert rows[f"{kind} (per (token, head) scales)"].gqa == cache.bytes_per_token
    text = kv_cache_table(heads=8, head_dim=64, kv_heads=2, dtype="bfloat16")
    assert "by storage format" in text and "int4 (per (token, head) scales)" in text
