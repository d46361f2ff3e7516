"""attn_implementation="attnkit" in tiny seeded models of five families: the eager path's logits and weights."""

import pytest
import torch
from transformers import (
    AutoModel,
    BertConfig,
    BertModel,
    Gemma2Config,
    Gemma2ForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
)

from attnkit import masks
from attnkit.integrations.transformers import register

from .helpers import VOCAB, assert_same_outputs, left_padded, right_padded, tokens, twins

SMALL = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def bert():
    return BertConfig(**SMALL)


def gpt2():
    return GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, bos_token_id=1, eos_token_id=2)


def llama(**extra):
    return LlamaConfig(**SMALL, num_key_value_heads=2, **extra)


def mistral(window=5):
    return MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=window)


def gemma2():
    # soft-capping, scaling 1/sqrt(6) with head_dim 8, alternating sliding / full layers
    return Gemma2Config(**SMALL, num_key_value_heads=2, head_dim=8, sliding_window=5, query_pre_attn_scalar=6,
                        attn_logit_softcapping=2.0, final_logit_softcapping=None)


def test_bert_with_right_padding():
    eager, ours = twins(BertModel, bert())
    assert_same_outputs(eager, ours, input_ids=tokens(), attention_mask=right_padded())


def test_gpt2_left_padding_and_greedy_generation_with_cache():
    eager, ours = twins(GPT2LMHeadModel, gpt2())
    assert_same_outputs(eager, ours, input_ids=tokens(), attention_mask=left_padded())
    kwargs = dict(attention_mask=left_padded(), max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(tokens(), **kwargs), eager.generate(tokens(), **kwargs))


def test_llama_grouped_query_heads_generation():
    eager, ours = twins(LlamaForCausalLM, llama())
    assert_same_outputs(eager, ours, input_ids=tokens(), attention_mask=left_padded())
    kwargs = dict(attention_mask=left_padded(), max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(tokens(), **kwargs), eager.generate(tokens(), **kwargs))


def test_llama_chunked_prefill_over_a_cache_matches_one_pass():
    _, ours = twins(LlamaForCausalLM, llama())
    ids = tokens(batch=1, length=14)
    with torch.no_grad():
        whole = ours(ids).logits
        first = ours(ids[:, :9], use_cache=True)
        rest = ours(ids[:, 9:], cache=first.past_key_values, use_cache=True).logits
    torch.testing.assert_close(torch.cat([first.logits, rest], 1), whole, rtol=0, atol=1e-5)


def test_mistral_window_on_a_longer_prompt_and_generation():
    eager, ours = twins(MistralForCausalLM, mistral(window=5))
    assert_same_outputs(eager, ours, input_ids=tokens(length=23))
    kwargs = dict(max_new_tokens=10, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(tokens(length=17), **kwargs), eager.generate(tokens(length=17), **kwargs))


def test_gemma2_softcap_scaling_and_alternating_windows():
    eager, ours = twins(Gemma2ForCausalLM, gemma2())
    assert_same_outputs(eager, ours, input_ids=tokens(length=13), attention_mask=left_padded(length=13))
    kwargs = dict(attention_mask=left_padded(length=13), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(ours.generate(tokens(length=13), **kwargs), eager.generate(tokens(length=13), **kwargs))


def test_a_registered_window_makes_a_dense_model_equal_to_its_windowed_twin():
    # Mistral is Llama with a window: a Llama on "attnkit" with an extra window of 4 keys back
    # (5 keys with the query's own) computes what eager Mistral with sliding_window=5 computes.
    name = register("attnkit-test-window", mask=masks.sliding_window(4))
    windowed, _ = twins(MistralForCausalLM, mistral(window=5))
    dense = LlamaForCausalLM(llama()).eval()
    dense.load_state_dict(windowed.state_dict())
    dense.set_attn_implementation(name)
    ids = tokens(length=19)
    with torch.no_grad():
        torch.testing.assert_close(dense(ids).logits, windowed(ids).logits, rtol=0, atol=1e-5)
    kwargs = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(dense.generate(ids, **kwargs), windowed.generate(ids, **kwargs))


def test_packed_sequences_take_transformers_mask_exactly():
    eager, ours = twins(LlamaForCausalLM, llama())
    position_ids = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3]])
    ids = tokens(batch=1)
    with torch.no_grad():
        a = eager(ids, position_ids=position_ids).logits
        b = ours(ids, position_ids=position_ids).logits
    torch.testing.assert_close(b, a, rtol=0, atol=1e-5)


def test_from_config_from_pretrained_and_switching(tmp_path):
    model = LlamaForCausalLM._from_config(llama(), attn_implementation="attnkit")
    assert model.config._attn_implementation == "attnkit"
    model.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path, attn_implementation="attnkit", local_files_only=True)
    assert loaded.config._attn_implementation == "attnkit"
    loaded.set_attn_implementation("eager")
    loaded.set_attn_implementation("attnkit")
    assert loaded.config._attn_implementation == "attnkit"


def test_dropout_in_training_is_applied_and_off_in_eval():
    config = llama(attention_dropout=0.5)
    _, ours = twins(LlamaForCausalLM, config)
    ids = tokens(batch=1)
    ours.train()
    torch.manual_seed(0)
    first = ours(ids).logits
    second = ours(ids).logits
    assert not torch.allclose(first, second)  # random weights dropped
    first.sum().backward()  # and it trains
    ours.eval()
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, ours(ids).logits)


@pytest.mark.parametrize("batch", [1, 3])
def test_static_cache_generation(batch):
    eager, ours = twins(LlamaForCausalLM, llama())
    ids = tokens(batch=batch, length=7)
    kwargs = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, cache_implementation="static")
    assert torch.equal(ours.generate(ids, **kwargs), eager.generate(ids, **kwargs))


def test_a_training_step_has_eager_gradients_with_right_padding():
    eager, ours = twins(LlamaForCausalLM, llama())
    keep = right_padded(pad=4)
    labels = tokens().masked_fill(keep == 0, -100)
    for model in (eager, ours):
        model.train()
        model(tokens(), attention_mask=keep, labels=labels).loss.backward()
    for (name, a), b in zip(eager.named_parameters(), ours.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=1e-6, msg=name)
