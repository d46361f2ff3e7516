"""Every text family of transformers, found in transformers itself, as a tiny seeded model on eager and on attnkit.

A family is a ``model_type`` that transformers maps to a causal-LM, masked-LM, seq2seq-LM or
text-encoding class, that no multimodal mapping lists and whose configuration has no vision or
audio part, and whose modeling file calls the attention interface (``ALL_ATTENTION_FUNCTIONS``).
Its tiny configuration is the class's own defaults with every size that exists in it shrunk
(:data:`SHRINK`), multi-head latent attention given one key head per query head, and enough
layers for every kind of attention layer the default layout has; :data:`OVERRIDES` names the
few families that need more, and why.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import sys

import torch
import transformers
from huggingface_hub.errors import StrictDataclassError
from transformers.models.auto import configuration_auto, modeling_auto

from attnkit.integrations.transformers import attention_function

from .helpers import VOCAB, left_padded, main_output, right_padded, tokens

_HEADS = {"seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES", "masked": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
          "causal": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "encoding": "MODEL_FOR_TEXT_ENCODING_MAPPING_NAMES"}
_MULTIMODAL = ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES",
               "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES", "MODEL_FOR_TEXT_TO_WAVEFORM_MAPPING_NAMES",
               "MODEL_FOR_TEXT_TO_SPECTROGRAM_MAPPING_NAMES", "MODEL_FOR_CTC_MAPPING_NAMES",
               "MODEL_FOR_IMAGE_MAPPING_NAMES")
_MODALITIES = ("vision", "audio", "image", "video", "speech", "vq")

SHRINK = dict(
    # widths and depths
    hidden_size=32, d_model=32, n_embd=32, dim=32, embed_dim=32, embedding_size=32, hidden_size_global=32,
    intermediate_size=64, ffn_dim=64, encoder_ffn_dim=64, decoder_ffn_dim=64, d_ff=64, n_inner=64, hidden_dim=64,
    num_hidden_layers=2, n_layer=2, n_layers=2, num_layers=2, encoder_layers=2, decoder_layers=2,
    num_decoder_layers=2, max_position_embeddings=64,
    # attention: 4 query heads of 8 dims on 2 key heads, windows of 5 that 12 tokens outgrow
    num_attention_heads=4, n_head=4, n_heads=4, num_heads=4, encoder_attention_heads=4, decoder_attention_heads=4,
    num_key_value_heads=2, head_dim=8, d_kv=8, rotary_dim=4,
    sliding_window=5, attention_window=5, local_attention_window_len=5,
    kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,  # latent attention
    index_n_heads=2, index_head_dim=8,  # sparse-attention indexers
    # experts and state-space blocks
    moe_intermediate_size=32, shared_expert_intermediate_size=32, expert_intermediate_size=32,
    expert_ffn_hidden_size=32, num_experts=4, num_local_experts=4, n_routed_experts=4, moe_num_experts=4,
    n_shared_experts=1, num_experts_per_tok=2, top_k=2, moe_k=2, n_group=1, topk_group=1,
    mamba_n_heads=4, n_mamba_heads=4,
)

OVERRIDES = {
    # defaults with no attention layer at all (every layer a state-space or convolution block)
    "bamba": dict(attn_layer_indices=[1]),
    "granitemoehybrid": dict(layer_types=["mamba", "attention"]),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"]),
    # defaults transformers cannot build a model from
    "cohere_compass_text": dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e4}}),
    "dbrx": dict(attn_config=dict(kv_n_heads=2, rope_theta=1e4, clip_qkv=8.0)),
    "esm": dict(pad_token_id=1),  # its position ids are counted from the padding id
    "qwen4_exp_text": dict(indexer_n_heads=2, indexer_kv_heads=1, indexer_head_dim=8, indexer_budget=4,
                           indexer_compress_ratio=2),
    "xmod": dict(default_language="en_XX"),
    # sizes the shrunk defaults contradict
    # its sliding layers' sizes are keywords of their own, not fields
    "dots3_note_text": dict(swa_num_attention_heads=4, swa_num_key_value_heads=4, swa_q_lora_rank=24,
                            swa_kv_lora_rank=16, swa_head_dim=16, swa_qk_nope_head_dim=8, swa_v_head_dim=8),
    "dory": dict(n_input_layers=1, n_output_layers=1),  # 8 + 8 fixed layers of 36
    "esmc": dict(num_key_value_heads=4),  # no grouped-query heads
    "gemma3n_text": dict(num_kv_shared_layers=0),  # 15 of 35 layers share a cache
    "neomme": dict(head_dim=16),  # its M-RoPE rotates a multiple of 4 dims of a quarter of the head
    "zamba": dict(num_hidden_layers=4, attn_layer_period=1, attn_layer_offset=0),  # two shared-attention layers
    "zaya": dict(num_experts_per_tok=1),
}
PARAMETER_BUDGET = 10_000_000
# Keywords of the forward pass (and generate) for families that need them.
CALL = {"blt": dict(use_cache=False)}  # its cache is built from a num_hidden_layers its configuration lacks
# Families compared without padding: the outputs at padded positions are unspecified (eager averages every key
# there, sdpa and attnkit differ), and these models feed them to real positions (BLT's byte patcher).
NO_PADDING = {"blt"}


def _source_of(model_class) -> str:
    return inspect.getsource(sys.modules[model_class.__module__])


def families() -> dict[str, tuple[str, type]]:
    """``model_type -> (head, model class)`` of every text family whose layers call the attention interface."""
    multimodal = set().union(*(getattr(modeling_auto, name) for name in _MULTIMODAL))
    found = {}
    for head, mapping in _HEADS.items():
        for model_type, class_name in getattr(modeling_auto, mapping).items():
            if model_type in found or model_type in multimodal or model_type not in configuration_auto.CONFIG_MAPPING:
                continue
            parts = getattr(configuration_auto.CONFIG_MAPPING[model_type], "sub_configs", {})
            if any(modality in part for part in parts for modality in _MODALITIES):
                continue
            model_class = getattr(transformers, class_name if isinstance(class_name, str) else class_name[0], None)
            if model_class is not None and "ALL_ATTENTION_FUNCTIONS" in _source_of(model_class):
                found[model_type] = (head, model_class)
    return found


def _is_attention(layer_type) -> bool:
    return isinstance(layer_type, str) and (layer_type == "hybrid" or (
        "attention" in layer_type and "linear" not in layer_type))


def _layers_for_every_attention_kind(config_class, kwargs) -> int:
    """Enough layers of the default layout to hold one layer of each kind of attention it has."""
    default = config_class(**{k: v for k, v in kwargs.items() if k not in ("num_hidden_layers", "layer_types")})
    first = {}
    for index, layer_type in enumerate(getattr(default, "layer_types", None) or ()):
        if _is_attention(layer_type):
            first.setdefault(layer_type, index)
    return max([kwargs["num_hidden_layers"]] + [index + 1 for index in first.values()]), default


def _shrunk(config_class, overrides: dict):
    fields = {f.name for f in dataclasses.fields(config_class)}
    kwargs = {k: v for k, v in SHRINK.items() if k in fields}
    if "vocab_size" in fields:
        kwargs["vocab_size"] = VOCAB
    defaults = {f.name: f.default for f in dataclasses.fields(config_class)}
    kwargs.update({k: VOCAB for k, default in defaults.items() if "vocab" in k and type(default) is int})
    if "kv_lora_rank" in fields:  # multi-head latent attention expands its latent to every query head
        kwargs["num_key_value_heads"] = kwargs["num_attention_heads"]
    for key, part in getattr(config_class, "sub_configs", {}).items():
        if key in fields and isinstance(part, type):
            kwargs[key] = _shrunk(part, {}).to_dict()
    kwargs.update(overrides)
    if "num_hidden_layers" not in kwargs:
        return config_class(**kwargs)
    layers, default = _layers_for_every_attention_kind(config_class, kwargs)
    layers = overrides.get("num_hidden_layers", layers)
    with contextlib.suppress(StrictDataclassError):  # a layout of fixed length refuses another layer count
        config = config_class(**{**kwargs, "num_hidden_layers": layers})
        if len(getattr(config, "layer_types", None) or [None] * layers) == layers:
            return config
    field = getattr(config_class, "attribute_map", {}).get("layer_types", "layer_types")
    return config_class(**{**kwargs, "num_hidden_layers": layers, field: default.layer_types[:layers]})


def tiny_config(model_type: str):
    """The family's tiny configuration (see the module docstring)."""
    config = _shrunk(configuration_auto.CONFIG_MAPPING[model_type], OVERRIDES.get(model_type, {}))
    for name, small in (("pad_token_id", 0), ("bos_token_id", 1), ("eos_token_id", 2), ("decoder_start_token_id", 1)):
        if isinstance(getattr(config, name, None), int) and getattr(config, name) >= VOCAB:
            setattr(config, name, small)
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", None) is None:
        config.decoder_start_token_id = 0
    return config


@contextlib.contextmanager
def _counting_attnkit_calls():
    calls = []
    real = attention_function.attention
    attention_function.attention = lambda *args, **kwargs: calls.append(1) or real(*args, **kwargs)
    try:
        yield calls
    finally:
        attention_function.attention = real


def compare_with_eager(model_type: str, head: str, model_class) -> None:
    """Eager and attnkit twins agree: outputs at real tokens within 1e-5, and greedy decoding token for token.

    Raises :class:`attnkit.UnsupportedFeature` where attnkit refuses what the model asks.
    """
    config = tiny_config(model_type)
    with torch.device("meta"):  # sized before it takes memory: a new family's defaults may escape the shrinking
        size = sum(p.numel() for p in model_class(copy.deepcopy(config)).parameters())
    assert size < PARAMETER_BUDGET, f"{model_type}: the tiny model has {size} parameters; shrink more"
    torch.manual_seed(0)
    eager = model_class(copy.deepcopy(config)).eval()
    ours = model_class(copy.deepcopy(config)).eval()
    ours.load_state_dict(eager.state_dict())
    eager.set_attn_implementation("eager")
    ours.set_attn_implementation("attnkit")
    keep = left_padded(pad=4) if head == "causal" else right_padded(pad=3)
    keep = torch.ones_like(keep) if model_type in NO_PADDING else keep
    inputs = dict(input_ids=tokens(), attention_mask=keep, **CALL.get(model_type, {}))
    real = keep.bool()
    if head == "seq2seq":
        inputs["decoder_input_ids"] = tokens(length=5, seed=2)
        real = torch.ones(2, 5, dtype=torch.bool)
    with torch.no_grad(), _counting_attnkit_calls() as calls:
        expected, got = main_output(eager(**inputs)), main_output(ours(**inputs))
    assert calls, f"{model_type}: attnkit was never called"
    torch.testing.assert_close(got[real], expected[real], rtol=0, atol=1e-5, msg=model_type)
    if head in ("causal", "seq2seq"):
        kwargs = dict(attention_mask=keep, max_new_tokens=4, do_sample=False, pad_token_id=0,
                      **CALL.get(model_type, {}))
        assert torch.equal(ours.generate(tokens(), **kwargs), eager.generate(tokens(), **kwargs)), model_type
