"""TransformerLM from and to transformers causal language models: their configuration and weights copied.

:meth:`TransformerLM.from_transformers <attnkit.models.TransformerLM.from_transformers>` and
:meth:`~attnkit.models.TransformerLM.to_transformers` call these. A model is read by its attributes
(``model.layers``, ``config``, ...), so transformers is imported only to build one
(:func:`lm_to_transformers`). Each attention layer goes through
:meth:`attnkit.nn.MultiHeadAttention.from_transformers`, so a layout the layer converter takes (heads
narrower than the model, biases, QK-norm, rotary scaling, sliding windows) the model converter takes.

The families' blocks are one pre-norm decoder layer (Llama, Mistral, Qwen2, Qwen3, Gemma)::

    h = h + Attn(RMSNorm_1(h));   h = h + W_down (act(W_gate RMSNorm_2(h)) * W_up RMSNorm_2(h))

with ``act`` SiLU (SwiGLU) or GELU's tanh approximation (Gemma's GEGLU), a final RMSNorm and the
output head (tied to the embeddings or not); Gemma multiplies the embeddings by ``sqrt(hidden)`` and
its norms by ``1 + w``.
"""

from __future__ import annotations

import math

import torch

from .. import masks
from ..errors import ArgumentError
from ..integrations.transformers_layers import norm_eps, norm_weight, rotary_from_config, sliding_window_of
from ..nn.multihead import MultiHeadAttention
from ..nn.rope_scaling import LinearScaling, Llama3Scaling, ProportionalScaling, YarnScaling

__all__ = ["FAMILIES", "lm_from_transformers", "lm_to_transformers"]

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma")
# transformers' hidden_act -> the gated unit of attnkit's feed-forward network
_GLU = {"silu": "swiglu", "swish": "swiglu", "gelu_pytorch_tanh": "geglu-tanh", "gelu_new": "geglu-tanh",
        "gelu": "geglu"}
_NOT_MAPPED = {
    "gemma2": "its layers add two norms after the attention and the feed-forward network, cap scores and logits "
              "with tanh, and window every other layer",
    "gemma3_text": "its layers add two norms after the attention and the feed-forward network and window five layers "
                   "in six, with another rotary table on those",
}


def _parts(model):
    """``(decoder, head or None)``: a ``...ForCausalLM`` holds the decoder as ``model`` and the head as ``lm_head``."""
    if hasattr(model, "lm_head") and hasattr(model, "model"):
        return model.model, model.lm_head
    return model, None


def _copy(dst, src) -> None:
    with torch.no_grad():
        dst.copy_(src)


def _bias(who: str, attn) -> bool | str:
    """TransformerLM's ``attention_bias`` from which of a layer's projections have a bias."""
    q, k, v, o = (getattr(attn, name).bias is not None for name in ("q_proj", "k_proj", "v_proj", "o_proj"))
    if q == k == v:
        if o == q:
            return q
        if q:
            return "qkv"
    raise ArgumentError(f"{who}: biases on q, k, v, o = {q}, {k}, {v}, {o}; TransformerLM takes all, none, or "
                        "q, k and v only")


def lm_from_transformers(cls, model):
    """``cls`` (a :class:`~attnkit.models.TransformerLM`) with the configuration and weights of ``model``."""
    who = f"TransformerLM.from_transformers({type(model).__name__})"
    config = model.config
    kind = getattr(config, "model_type", None)
    if kind in _NOT_MAPPED:
        raise ArgumentError(f"{who}: a {kind} model does not map onto TransformerLM: {_NOT_MAPPED[kind]}")
    if kind not in FAMILIES:
        raise ArgumentError(f"{who}: model_type must be one of {', '.join(FAMILIES)}; got {kind!r}")
    body, head = _parts(model)
    layers = list(body.layers)
    if not layers:
        raise ArgumentError(f"{who}: the model has no layers")
    if getattr(config, "use_bidirectional_attention", False):
        raise ArgumentError(f"{who}: use_bidirectional_attention=True; TransformerLM.from_transformers converts "
                            "causal language models")
    act = getattr(config, "hidden_act", None)
    if act not in _GLU:
        raise ArgumentError(f"{who}: hidden_act must be one of {', '.join(_GLU)}; got {act!r}")
    if getattr(config, "mlp_bias", False):
        raise ArgumentError(f"{who}: mlp_bias=True; TransformerLM's gated feed-forward networks have no biases")
    windows = {sliding_window_of(layer.self_attn) for layer in layers}
    if len(windows) > 1:
        raise ArgumentError(f"{who}: sliding windows on some layers only (layer windows {sorted(map(str, windows))}); "
                            "TransformerLM applies one attention_mask to every layer")
    window = windows.pop()
    attn = layers[0].self_attn
    heads, kv_heads, d = config.num_attention_heads, config.num_key_value_heads, attn.head_dim
    if not math.isclose(float(attn.scaling), d ** -0.5, rel_tol=1e-12):
        raise ArgumentError(f"{who}: the attention scales scores by {attn.scaling}; TransformerLM scales by "
                            f"1 / sqrt(head_dim) = {d ** -0.5}")
    qk_norm = getattr(attn, "q_norm", None) is not None
    if qk_norm and not math.isclose(norm_eps(attn.q_norm), 1e-6, rel_tol=1e-9):
        raise ArgumentError(f"{who}: the QK-norm's epsilon is {norm_eps(attn.q_norm)}; TransformerLM's QK-norm "
                            "uses 1e-6")
    rotary = rotary_from_config(config, d)
    embed = body.embed_tokens
    tied = head is None or head.weight is embed.weight
    if head is None and not getattr(config, "tie_word_embeddings", False):
        raise ArgumentError(f"{who}: a bare decoder without lm_head needs tie_word_embeddings=True (the head is then "
                            "the embedding matrix); pass the ...ForCausalLM model")
    w = embed.weight
    lm = cls(config.vocab_size, dim=config.hidden_size, num_heads=heads, num_layers=len(layers),
             ff_dim=config.intermediate_size, dropout=0.0, activation=_GLU[act], norm_first=True, positional="rotary",
             attention="softmax", attention_mask=None if window is None else masks.sliding_window(window - 1, 0),
             max_len=config.max_position_embeddings, tie_embeddings=tied, norm="rms", qk_norm=qk_norm,
             rotary={"pairing": rotary.pairing, "base": rotary.base, "fraction": rotary.fraction,
                     "scaling": rotary.scaling},
             head_dim=None if heads * d == config.hidden_size else d,
             num_kv_heads=None if kv_heads == heads else kv_heads, attention_bias=_bias(who, attn),
             eps=norm_eps(layers[0].input_layernorm),
             embed_scale=float(getattr(embed, "scalar_embed_scale", 1.0))).to(device=w.device, dtype=w.dtype)
    _copy(lm.embed.embed.weight, w)
    for mine, theirs in zip(lm.body.layers, layers, strict=True):
        mine.self_attn.load_state_dict(MultiHeadAttention.from_transformers(theirs.self_attn).state_dict())
        for norm, their_norm in ((mine.norm1, theirs.input_layernorm), (mine.norm3, theirs.post_attention_layernorm)):
            _copy(norm.weight, norm_weight(their_norm))
            norm.eps = norm_eps(their_norm)
        mlp = theirs.mlp
        _copy(mine.linear1.weight, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        _copy(mine.linear2.weight, mlp.down_proj.weight)
    _copy(lm.body.norm.weight, norm_weight(body.norm))
    lm.body.norm.eps = norm_eps(body.norm)
    if not tied:
        _copy(lm.head.weight, head.weight)
    return lm.train(model.training)


def _rope_parameters(who: str, base: float, scaling) -> dict:
    """transformers' ``rope_parameters`` for a rotation of ``base`` with ``scaling``."""
    params = {"rope_type": "default", "rope_theta": float(base)}
    if scaling is None:
        return params
    if isinstance(scaling, LinearScaling):
        return {**params, "rope_type": "linear", "factor": scaling.factor}
    if isinstance(scaling, Llama3Scaling):
        return {**params, "rope_type": "llama3", "factor": scaling.factor, "low_freq_factor": scaling.low_freq_factor,
                "high_freq_factor": scaling.high_freq_factor,
                "original_max_position_embeddings": scaling.original_max_position}
    if isinstance(scaling, YarnScaling):
        extra = {name: getattr(scaling, name) for name in ("mscale", "mscale_all_dim", "attention_factor")
                 if getattr(scaling, name) is not None}
        return {**params, "rope_type": "yarn", "factor": scaling.factor, "beta_fast": scaling.beta_fast,
                "beta_slow": scaling.beta_slow, "original_max_position_embeddings": scaling.original_max_position,
                "truncate": scaling.truncate, **extra}
    if isinstance(scaling, ProportionalScaling):
        return {**params, "rope_type": "proportional", "factor": scaling.factor,
                "partial_rotary_factor": scaling.fraction}
    raise ArgumentError(f"{who}: the rotary scaling {scaling!r} has no transformers rope_parameters here; expected "
                        "none, linear, llama3, yarn or proportional")


def _window(mask) -> int | None:
    """The ``w`` of transformers' ``sliding_window`` a mask is (query ``i`` sees ``i - w < j <= i``), or None."""
    if type(mask).__name__ == "_SlidingWindow" and mask.right == 0 and mask.align == "bottom_right":
        return mask.left + 1
    return None


def _family(lm) -> tuple[str, dict]:
    """The transformers family ``lm`` is, with the options its config needs beyond the shared ones; or raises."""
    who = "TransformerLM.to_transformers"
    c = lm.config
    rotary = dict(c["rotary"] or {})
    need = {"causal": True, "norm": "rms", "norm_first": True, "positional": "rotary", "gate": False,
            "softmax_every": None}
    wrong = {k: c[k] for k, v in need.items() if c[k] != v}
    if c["attention"] not in ("softmax", "multi-head"):
        wrong["attention"] = c["attention"]
    if rotary.get("pairing") != "half" or rotary.get("fraction", 1.0) != 1.0:
        wrong["rotary"] = c["rotary"]
    if c["attention_bias"] not in (True, False):
        wrong["attention_bias"] = c["attention_bias"]
    window = _window(c["attention_mask"])
    if c["attention_mask"] is not None and window is None:
        wrong["attention_mask"] = c["attention_mask"]
    gemma = c["activation"] == "geglu-tanh" and lm.embed.scale == lm.embed.dim ** 0.5
    if c["activation"] != "swiglu" and not gemma:
        wrong["activation"] = c["activation"]
    elif not gemma and lm.embed.scale != 1.0:
        wrong["embed_scale"] = c["embed_scale"]
    if c["qk_norm"] and (c["eps"] != 1e-6 or window is not None or gemma):
        wrong["qk_norm"] = c["qk_norm"]  # Qwen3: its QK-norm's epsilon is the blocks' (attnkit's 1e-6); no window here
    if window is not None and (c["attention_bias"] or gemma):
        wrong["attention_mask"] = c["attention_mask"]  # Mistral: no biases, SwiGLU
    if wrong:
        raise ArgumentError(f"{who}: needs a Llama, Qwen3, Mistral or Gemma block ({need}, softmax attention, rotary "
                            "pairing 'half' on every feature, attention_bias True or False; SwiGLU with "
                            "embed_scale=1, or GEGLU-tanh with embed_scale=sqrt(dim) (Gemma); qk_norm with eps=1e-6 "
                            "(Qwen3); a causal sliding window without biases (Mistral)); got "
                            f"{ {k: wrong[k] for k in sorted(wrong)} }")
    if gemma:
        return "Gemma", {"attention_bias": c["attention_bias"], "hidden_act": "gelu_pytorch_tanh"}
    if window is not None:
        return "Mistral", {"sliding_window": window, "hidden_act": "silu"}
    return ("Qwen3" if c["qk_norm"] else "Llama"), {"attention_bias": c["attention_bias"], "hidden_act": "silu"}


def lm_to_transformers(lm):
    """The transformers model equal to ``lm`` (Llama, Qwen3 with QK-norm, Mistral with a window, Gemma), weights copied.

    Gemma multiplies its norms by ``1 + w``: ``w`` is written as attnkit's scale minus one.
    """
    import transformers

    who = "TransformerLM.to_transformers"
    family, options = _family(lm)
    c = lm.config
    first = lm.body.layers[0]
    attn = first.self_attn
    scaling = attn.rotary.scaling
    config = getattr(transformers, f"{family}Config")(
        vocab_size=lm.vocab_size, hidden_size=attn.embed_dim, intermediate_size=first.ff_dim,
        num_hidden_layers=len(lm.body.layers), num_attention_heads=attn.num_heads,
        num_key_value_heads=attn.num_kv_heads, head_dim=attn.head_dim,
        max_position_embeddings=lm.max_len or 4096, rms_norm_eps=c["eps"], tie_word_embeddings=c["tie_embeddings"],
        rope_parameters=_rope_parameters(who, attn.rotary.base, scaling), **options)
    offset = 1.0 if family == "Gemma" else 0.0  # Gemma's norms multiply by 1 + w
    w = lm.embed.embed.weight
    model = getattr(transformers, f"{family}ForCausalLM")(config).to(device=w.device, dtype=w.dtype)
    body = model.model
    e, kv = attn.inner_dim, attn.num_kv_heads * attn.head_dim
    _copy(body.embed_tokens.weight, w)
    for mine, theirs in zip(lm.body.layers, body.layers, strict=True):
        a, t = mine.self_attn, theirs.self_attn
        for proj, weight in zip((t.q_proj, t.k_proj, t.v_proj), a.in_proj_weight.split([e, kv, kv]), strict=True):
            _copy(proj.weight, weight)
        if a.in_proj_bias is not None:
            for proj, bias in zip((t.q_proj, t.k_proj, t.v_proj), a.in_proj_bias.split([e, kv, kv]), strict=True):
                _copy(proj.bias, bias)
            _copy(t.o_proj.bias, a.out_proj.bias)
        _copy(t.o_proj.weight, a.out_proj.weight)
        if a.qk_norm is not None:
            _copy(t.q_norm.weight, a.qk_norm.q_norm.weight)
            _copy(t.k_norm.weight, a.qk_norm.k_norm.weight)
        _copy(theirs.input_layernorm.weight, mine.norm1.weight - offset)
        _copy(theirs.post_attention_layernorm.weight, mine.norm3.weight - offset)
        gate, up = mine.linear1.weight.chunk(2)
        _copy(theirs.mlp.gate_proj.weight, gate)
        _copy(theirs.mlp.up_proj.weight, up)
        _copy(theirs.mlp.down_proj.weight, mine.linear2.weight)
    _copy(body.norm.weight, lm.body.norm.weight - offset)
    if not c["tie_embeddings"]:
        _copy(model.lm_head.weight, lm.head.weight)
    return model.train(lm.training)
