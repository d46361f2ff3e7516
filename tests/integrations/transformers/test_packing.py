"""Packed documents and sparse indexers' choices in transformers models: varlen and selected keys, equal to eager."""

from __future__ import annotations

import pytest
import torch
from transformers import DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

import attnkit
import attnkit.integrations.transformers
from attnkit import masks
from attnkit.integrations.transformers import ModelMask, packing
from attnkit.integrations.transformers.attention_function import make_attention_function
from attnkit.kernels import selected
from tests.oracle import dense_attention

from .families import tiny_config
from .helpers import twins

LENGTHS = (7, 12, 1, 5)


def _documents(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 97, (n,), generator=g).tolist() for n in LENGTHS]


def _model(model_class, config):
    torch.manual_seed(0)
    model = model_class(config).eval()
    model.set_attn_implementation("attnkit")
    return model


@pytest.fixture
def varlen_calls(monkeypatch):
    seen = []
    real = packing.varlen_attn
    monkeypatch.setattr(packing, "varlen_attn", lambda *a, **k: seen.append((a, k)) or real(*a, **k))
    monkeypatch.setattr(ModelMask, "dense", lambda self: pytest.fail("a dense mask was built"))
    return seen


@pytest.mark.parametrize("flash_kwargs", [False, True])
def test_a_flattened_batch_gives_each_documents_logits_alone(varlen_calls, flash_kwargs):
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = _model(LlamaForCausalLM, config)
    docs = _documents()
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs)([{"input_ids": d} for d in docs])
    batch.pop("labels")
    with torch.no_grad():  # no cache: transformers reads packing from position_ids only then (training)
        packed = model(**batch, use_cache=flash_kwargs).logits[0]
        alone = torch.cat([model(input_ids=torch.tensor([d])).logits[0] for d in docs])
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-5)
    assert len(varlen_calls) == config.num_hidden_layers


def test_the_packed_call_runs_the_block_path_at_the_cost_of_its_documents(varlen_calls):
    config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = _model(LlamaForCausalLM, config)
    docs = _documents(1)
    batch = DataCollatorWithFlattening()([{"input_ids": d} for d in docs])
    with torch.no_grad():
        model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
    (args, kwargs), = varlen_calls
    q, k, v, cu, _, longest, _ = args
    options = {key: kwargs[key] for key in ("scale", "enable_gqa", "mask")}
    decision = attnkit.explain_varlen(q, k, v, cu, cu, longest, longest, block_size=32, **options)
    assert decision.backend == "blocksparse"
    each = [attnkit.explain_varlen(q[a:b], k[a:b], v[a:b], cu[:2] * 0 + torch.tensor([0, b - a]),
                                   cu[:2] * 0 + torch.tensor([0, b - a]), b - a, b - a, block_size=32, **options)
            for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)]
    assert decision.flops == sum(d.flops for d in each) > 0


def test_a_sliding_window_model_keeps_its_window_inside_each_document(varlen_calls):
    config = MistralConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=4, max_position_embeddings=64)
    model = _model(MistralForCausalLM, config)
    docs = _documents(2)
    batch = DataCollatorWithFlattening()([{"input_ids": d} for d in docs])
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits[0]
        alone = torch.cat([model(input_ids=torch.tensor([d])).logits[0] for d in docs])
    torch.testing.assert_close(packed, alone, rtol=0, atol=1e-5)
    assert varlen_calls and varlen_calls[0][1]["mask"].band(0, 0) == (-3, 0)


def test_cu_seq_lens_alone_are_documents_of_the_layers_mask():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 4, 25, 8, generator=g, dtype=torch.float64) for _ in range(3))
    cu = torch.tensor([0, 7, 19, 20, 25], dtype=torch.int32)
    out, _ = make_attention_function()(torch.nn.Module(), q, k, v, None, is_causal=True, cu_seq_lens_q=cu,
                                       cu_seq_lens_k=cu)
    ids = torch.repeat_interleave(torch.arange(4), cu.diff())
    expected = dense_attention(q, k, v, mask=masks.segments(ids) & masks.causal())
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=0, atol=1e-12)


def test_deepseek_v32_with_a_small_top_k_equals_eager_on_the_gathered_path(monkeypatch):
    from transformers import DeepseekV32ForCausalLM

    config = tiny_config("deepseek_v32")
    config.index_topk = 3
    eager, ours = twins(DeepseekV32ForCausalLM, config)
    gathered = []
    real = selected.run
    monkeypatch.setattr(selected, "run", lambda p: gathered.append(p.sizes) or real(p))
    ids = torch.randint(3, 97, (2, 20), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, eager(input_ids=ids).logits, rtol=0, atol=1e-5)
    assert gathered  # 3 of 20 keys: the selected keys were gathered, not a dense mask


def test_block_indices_are_the_indexers_blocks_for_each_head_group():
    class Indexed(torch.nn.Module):
        indexer = type("Indexer", (), {"block_size": 3})()

    q, k, v = (torch.randn(2, h, 10, 8, dtype=torch.float64) for h in (4, 2, 2))
    blocks = torch.randint(-1, 4, (2, 2, 10, 2), generator=torch.Generator().manual_seed(6))
    out, _ = make_attention_function()(Indexed(), q, k, v, None, is_causal=True, block_indices=blocks)
    chosen = masks.selected_blocks(blocks, 3, group_size=2) & masks.causal()
    expected = dense_attention(q, k, v, mask=chosen.materialize(10, 10, batch=2, heads=4))
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=0, atol=1e-12)
    with pytest.raises(attnkit.UnsupportedFeature, match="block_indices"):
        make_attention_function()(torch.nn.Module(), q, k, v, None, is_causal=True, block_indices=blocks)
