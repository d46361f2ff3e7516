"""TransformerLM.from_transformers / to_transformers: tiny random Llama, Mistral, Qwen2, Qwen3 and Gemma models.

Each transformers model is built from a small configuration shaped like the released checkpoints
(heads narrower or wider than the model, grouped key/value heads, tied or separate heads, a
sliding window shorter than the generation), every parameter drawn at random (so the norms'
ones and zeros hide nothing), and run in float32 with its eager attention: the converted model's
logits must be within 1e-5 of the model's, its 16 greedy tokens (cached generation) the same, and
a save/load round trip must give the same logits.
"""

from __future__ import annotations

import pytest
import torch
import transformers as hf

from attnkit import masks
from attnkit.errors import ArgumentError
from attnkit.models import TransformerLM

V, PREFIX, STEPS = 37, 5, 16
SHAPE = dict(vocab_size=V, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64)
FAMILIES = {
    "llama (GQA, biases, llama3 scaling)": ("Llama", dict(
        num_key_value_heads=2, attention_bias=True, rope_parameters={
            "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8, "rope_theta": 500.0})),
    "llama (tied embeddings, heads of 16 over 32)": ("Llama", dict(num_key_value_heads=1, head_dim=16,
                                                                    tie_word_embeddings=True)),
    "qwen3 (QK-norm, heads of 16 over 32)": ("Qwen3", dict(num_key_value_heads=2, head_dim=16)),
    "qwen2 (q/k/v biases, tied)": ("Qwen2", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "mistral (sliding window 6)": ("Mistral", dict(num_key_value_heads=2, head_dim=16, sliding_window=6)),
    "gemma (1 + w norms, sqrt(hidden) embeddings, GEGLU, heads of 16)": ("Gemma", dict(
        num_key_value_heads=1, head_dim=16)),
}


def _model(family, seed=0):
    prefix, options = FAMILIES[family]
    config = getattr(hf, f"{prefix}Config")(**SHAPE, **options)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(hf, f"{prefix}ForCausalLM")(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.2)  # norms near their scale of 1: logits of order 1
    return model.eval()


def _tokens(n=PREFIX + STEPS, seed=1):
    return torch.randint(0, V, (2, n), generator=torch.Generator().manual_seed(seed))


def _logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits


@pytest.fixture(params=list(FAMILIES), scope="module")
def converted(request):
    model = _model(request.param)
    return request.param, model, TransformerLM.from_transformers(model)


def test_from_transformers_gives_the_models_logits(converted):
    _family, model, lm = converted
    tokens = _tokens()
    want = _logits(model, tokens)
    with torch.no_grad():
        torch.testing.assert_close(lm(tokens), want, rtol=0, atol=1e-5)
    assert want.abs().max() > 1  # logits large enough for 1e-5 to mean something
    assert (lm.head.weight is lm.embed.embed.weight) == model.config.tie_word_embeddings


def test_from_transformers_generates_the_models_greedy_tokens(converted):
    _family, model, lm = converted
    prefix = _tokens(PREFIX, seed=2)
    want = model.generate(prefix, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    got, logits = lm.generate(prefix, STEPS, return_logits=True)
    assert torch.equal(got, want)
    assert len(set(got[:, PREFIX:].flatten().tolist())) > 2  # the tokens vary: the comparison is not of a constant
    torch.testing.assert_close(logits[:, -1], _logits(model, got[:, :-1])[:, -1], rtol=0, atol=1e-5)


def test_converted_model_round_trips_through_save_and_load(converted, tmp_path):
    lm = converted[2]
    lm.save(tmp_path / "lm.pt")
    again = TransformerLM.load(tmp_path / "lm.pt")
    tokens = _tokens()
    with torch.no_grad():
        assert torch.equal(again(tokens), lm(tokens))
    prefix = _tokens(PREFIX, seed=2)
    assert torch.equal(again.generate(prefix, STEPS), lm.generate(prefix, STEPS))


@pytest.mark.parametrize("family", ["llama (GQA, biases, llama3 scaling)",
                                    "llama (tied embeddings, heads of 16 over 32)",
                                    "qwen3 (QK-norm, heads of 16 over 32)", "mistral (sliding window 6)",
                                    "gemma (1 + w norms, sqrt(hidden) embeddings, GEGLU, heads of 16)"])
def test_to_transformers_round_trips(family):
    model = _model(family)
    back = TransformerLM.from_transformers(model).to_transformers()
    assert type(back) is type(model)
    tokens = _tokens()
    torch.testing.assert_close(_logits(back, tokens), _logits(model, tokens), rtol=0, atol=1e-5)
    prefix = _tokens(PREFIX, seed=2)
    kwargs = dict(max_new_tokens=STEPS, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(back.generate(prefix, **kwargs), model.generate(prefix, **kwargs))
    state, theirs = back.state_dict(), model.state_dict()
    assert state.keys() == theirs.keys()
    for key in state:  # the norms' scales are read back through the norm (norm_weight): float32 rounding
        torch.testing.assert_close(state[key], theirs[key], rtol=1e-6, atol=0, msg=key)


def test_a_native_llama_block_model_goes_to_transformers():
    torch.manual_seed(3)
    lm = TransformerLM(V, dim=24, num_heads=4, num_layers=2, ff_dim=30, dropout=0.0, norm="rms", activation="swiglu",
                       norm_first=True, positional="rotary", rotary={"pairing": "half", "base": 300.0},
                       num_kv_heads=2, attention_bias=False, eps=1e-6, embed_scale=1.0, max_len=64).eval()
    back = lm.to_transformers()
    assert isinstance(back, hf.LlamaForCausalLM)
    tokens = _tokens()
    with torch.no_grad():
        torch.testing.assert_close(_logits(back, tokens), lm(tokens), rtol=0, atol=1e-5)


def test_what_does_not_map_is_refused():
    gemma2 = hf.Gemma2ForCausalLM(hf.Gemma2Config(**SHAPE, num_key_value_heads=2, head_dim=8))
    with pytest.raises(ArgumentError, match=r"gemma2 model does not map onto TransformerLM: its layers add two norms"):
        TransformerLM.from_transformers(gemma2)
    mixed = hf.Qwen2ForCausalLM(hf.Qwen2Config(**SHAPE, num_key_value_heads=2, use_sliding_window=True,
                                               sliding_window=4, max_window_layers=1))
    with pytest.raises(ArgumentError, match=r"sliding windows on some layers only"):
        TransformerLM.from_transformers(mixed)
    mlp_bias = hf.LlamaForCausalLM(hf.LlamaConfig(**SHAPE, mlp_bias=True))
    with pytest.raises(ArgumentError, match=r"mlp_bias=True"):
        TransformerLM.from_transformers(mlp_bias)
    relu = hf.LlamaForCausalLM(hf.LlamaConfig(**SHAPE, hidden_act="relu"))
    with pytest.raises(ArgumentError, match=r"hidden_act must be one of .*; got 'relu'"):
        TransformerLM.from_transformers(relu)
    with pytest.raises(ArgumentError, match=r"model_type must be one of"):
        TransformerLM.from_transformers(hf.GPT2LMHeadModel(hf.GPT2Config(n_layer=1, n_embd=16, n_head=2)))
    with pytest.raises(ArgumentError, match=r"needs a Llama, Qwen3, Mistral or Gemma block .*'norm': 'layer'"):
        TransformerLM(V, dim=12, num_heads=3).to_transformers()
    block = dict(norm="rms", norm_first=True, positional="rotary", rotary={"pairing": "half"})
    with pytest.raises(ArgumentError, match=r"got \{'activation': 'geglu-tanh'\}"):
        TransformerLM(V, dim=12, num_heads=3, activation="geglu-tanh", embed_scale=1.0, **block).to_transformers()
    with pytest.raises(ArgumentError, match=r"got \{'attention_mask': sliding_window"):  # Mistral has no biases
        TransformerLM(V, dim=12, num_heads=3, activation="swiglu", embed_scale=1.0,
                      attention_mask=masks.sliding_window(3, 0), **block).to_transformers()
