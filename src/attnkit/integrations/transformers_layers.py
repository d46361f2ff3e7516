"""Modules from transformers attention layers: their configuration and weights copied, nothing imported.

The ``from_transformers`` classmethods of :class:`~attnkit.nn.MultiHeadAttention`,
:class:`~attnkit.nn.MultiHeadLatentAttention`, :class:`~attnkit.nn.DifferentialAttention` and
:class:`~attnkit.nn.Mamba2Mixer` call these. A layer is read by its attributes (``q_proj``,
``config``, ...), so transformers is needed only to build it; what a module cannot reproduce (a
tanh cap on the scores, a layer of another kind than the converter's) raises
:class:`~attnkit.errors.ArgumentError` naming the layer.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..errors import ArgumentError
from ..nn._recurrent import copy_weights, transformers_layer
from ..nn.rope_scaling import scaling_from_transformers
from ..nn.rotary import RotaryEmbedding

__all__ = ["rotary_from_config", "sliding_window_of", "multihead_from_transformers", "latent_from_transformers",
           "dsa_latent_from_transformers", "differential_from_transformers", "mamba2_from_transformers",
           "MAMBA2_MIXERS", "norm_weight", "norm_eps"]


def _name(layer) -> str:
    return type(layer).__name__


def rotary_from_config(config, dim: int, *, pairing: str = "half", layer_type: str | None = None) -> RotaryEmbedding:
    """The :class:`RotaryEmbedding` a transformers config describes for heads of ``dim`` features.

    Families with a table per kind of layer (Gemma 3: ``rope_parameters = {"sliding_attention": {...},
    "full_attention": {...}}``) give the one of ``layer_type``.
    """
    params = dict(getattr(config, "rope_parameters", None) or {})
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = dict(params[layer_type])
    base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    fraction = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None) or 1.0)
    if params.get("rope_type") == "proportional":  # its partial_rotary_factor picks the turning pairs of the whole head
        fraction = 1.0
    scaling = scaling_from_transformers(params, config.max_position_embeddings) if params else None
    return RotaryEmbedding(dim, base=float(base), pairing=pairing, fraction=float(fraction), scaling=scaling)


def norm_weight(norm: nn.Module) -> torch.Tensor:
    """The vector an RMSNorm multiplies the normalised input by, whatever its parametrisation.

    Some families store ``w`` and multiply by it (Llama, Qwen3), others store ``w`` and multiply by
    ``1 + w`` (Qwen3-Next, Gemma); the norm of a row of ones, ``w_eff / sqrt(1 + eps)``, tells them apart.
    """
    eps = norm_eps(norm)
    w = norm.weight
    with torch.no_grad():
        probe = norm(torch.ones(1, w.shape[-1], dtype=torch.float64 if w.dtype == torch.float64 else w.dtype))
    return (probe[0].double() * math.sqrt(1 + eps)).to(w.dtype)


def norm_eps(norm: nn.Module) -> float:
    """An RMSNorm's epsilon, under the names transformers' families use."""
    for name in ("eps", "variance_epsilon"):
        value = getattr(norm, name, None)
        if value is not None:
            return float(value)
    raise ArgumentError(f"{_name(norm)}: an RMSNorm with no eps or variance_epsilon attribute")


def _copy(dst: nn.Module, src: nn.Module) -> None:
    """Copy a linear layer's weight and bias (either may lack a bias only if both do)."""
    with torch.no_grad():
        dst.weight.copy_(src.weight)
        if dst.bias is not None:
            dst.bias.copy_(src.bias)


def sliding_window_of(layer) -> int | None:
    """The number of keys (the query's own included) a layer's model lets each query see, or None: all.

    Families with mixed layers set ``layer.sliding_window`` on the windowed ones (Qwen2, Qwen3, Gemma 2
    and 3); Mistral windows every layer through ``config.sliding_window``. transformers lets query ``i``
    see key ``j`` when ``i - window < j <= i``.
    """
    if hasattr(layer, "sliding_window"):
        return layer.sliding_window
    if type(layer).__name__.startswith("Mistral"):
        return getattr(layer.config, "sliding_window", None)
    return None


def multihead_from_transformers(cls, layer):
    """``cls`` (a :class:`MultiHeadAttention`) with the configuration and weights of a Llama-like layer."""
    from .. import masks

    config, who = layer.config, f"MultiHeadAttention.from_transformers({_name(layer)})"
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    d = layer.head_dim
    cap = getattr(layer, "attn_logit_softcapping", None)
    if cap is not None:
        raise ArgumentError(f"{who}: the layer caps its scores with tanh (attn_logit_softcapping={cap}); "
                            "MultiHeadAttention has no score cap: expected attn_logit_softcapping=None")
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        if not isinstance(getattr(layer, name, None), nn.Linear):
            raise ArgumentError(f"{who}: expected separate q_proj, k_proj, v_proj, o_proj linear layers; the layer's "
                                f"{name} is {type(getattr(layer, name, None)).__name__}")
    scale = float(layer.scaling)
    gated = layer.q_proj.out_features == 2 * heads * d
    norms = getattr(layer, "q_norm", None) is not None
    window = sliding_window_of(layer)
    w = layer.o_proj.weight
    module = cls(config.hidden_size, heads, bias=layer.q_proj.bias is not None, batch_first=True,
                 num_kv_heads=kv_heads, gate=gated, qk_norm=norms,
                 rotary=rotary_from_config(config, d, layer_type=getattr(layer, "layer_type", None)), head_dim=d,
                 out_bias=layer.o_proj.bias is not None,
                 scale=None if math.isclose(scale, d ** -0.5, rel_tol=1e-12) else scale,
                 mask=None if window is None else masks.sliding_window(window - 1, 0),
                 device=w.device, dtype=w.dtype)
    q_w, q_b = layer.q_proj.weight, layer.q_proj.bias
    if gated:  # Qwen3-Next interleaves each head's query and gate rows: (H, 2, d, E)
        q_w, g_w = q_w.unflatten(0, (heads, 2, d)).unbind(1)
        q_w, g_w = q_w.flatten(0, 1), g_w.flatten(0, 1)
        if q_b is not None:
            q_b, g_b = (t.flatten() for t in q_b.unflatten(0, (heads, 2, d)).unbind(1))
    with torch.no_grad():
        module.in_proj_weight.copy_(torch.cat([q_w, layer.k_proj.weight, layer.v_proj.weight]))
        if q_b is not None:
            module.in_proj_bias.copy_(torch.cat([q_b, layer.k_proj.bias, layer.v_proj.bias]))
        if gated:
            module.gate.proj.weight.copy_(g_w)
            if q_b is not None:
                module.gate.proj.bias.copy_(g_b)
        if norms:
            for mine, theirs in ((module.qk_norm.q_norm, layer.q_norm), (module.qk_norm.k_norm, layer.k_norm)):
                mine.weight.copy_(norm_weight(theirs))
                mine.eps = norm_eps(theirs)
    _copy(module.out_proj, layer.o_proj)
    return module.train(layer.training)


def _indexed(layer) -> bool:
    """Whether a layer restricts its keys to a lightning indexer's top-k (its own or an earlier layer's)."""
    return getattr(layer, "indexer", None) is not None or bool(getattr(layer, "skip_topk", False))


def latent_from_transformers(cls, layer):
    """``cls`` (a :class:`MultiHeadLatentAttention`) with a DeepSeek-V3 attention layer's configuration and weights."""
    if _indexed(layer):
        raise ArgumentError(f"MultiHeadLatentAttention.from_transformers({_name(layer)}): the layer attends only to "
                            "the top-k keys of a lightning indexer (DeepSeek Sparse Attention), which "
                            "MultiHeadLatentAttention would drop; expected a layer without an indexer, or use "
                            "attnkit.nn.DSALatentAttention.from_transformers")
    return _latent(cls, layer)


def _latent(cls, layer, **options):
    """The MLA part of a DeepSeek-V3-like layer: ``cls(..., **options)`` with its weights copied."""
    config = layer.config
    w = layer.o_proj.weight
    module = cls(config.hidden_size, config.num_attention_heads, kv_lora_rank=config.kv_lora_rank,
                 qk_rope_head_dim=config.qk_rope_head_dim, qk_nope_head_dim=config.qk_nope_head_dim,
                 v_head_dim=config.v_head_dim, q_lora_rank=config.q_lora_rank,
                 rotary=rotary_from_config(config, config.qk_rope_head_dim, pairing=_latent_pairing(layer)),
                 bias=layer.o_proj.bias is not None, **options).to(device=w.device, dtype=w.dtype)
    module.scale = float(layer.scaling)
    pairs = [(module.kv_down, layer.kv_a_proj_with_mqa), (module.kv_up, layer.kv_b_proj),
             (module.out_proj, layer.o_proj)]
    norms = [(module.kv_norm, layer.kv_a_layernorm)]
    if config.q_lora_rank is None:
        pairs.append((module.q_proj, layer.q_proj))
    else:
        pairs += [(module.q_down, layer.q_a_proj), (module.q_up, layer.q_b_proj)]
        norms.append((module.q_norm, layer.q_a_layernorm))
    for mine, theirs in pairs:
        _copy(mine, theirs)
    with torch.no_grad():
        for mine, theirs in norms:
            mine.weight.copy_(norm_weight(theirs))
            mine.eps = norm_eps(theirs)
    return module.train(layer.training)


def _latent_pairing(layer) -> str:
    """DeepSeek-V3's rotation pairs features per ``config.rope_interleave``; the DSA families' always interleave."""
    if _indexed(layer):
        return "interleaved"
    return "interleaved" if getattr(layer.config, "rope_interleave", False) else "half"


def dsa_latent_from_transformers(cls, layer):
    """``cls`` (a :class:`DSALatentAttention`) with a DeepSeek-V3.2 or GLM-MoE-DSA attention layer, indexer included.

    The indexer rotates the first ``qk_rope_head_dim`` of its features with the attention's table,
    in halves (DeepSeek-V3.2) or interleaved pairs (GLM-MoE-DSA, whose indexer class says so).
    """
    who = f"DSALatentAttention.from_transformers({_name(layer)})"
    indexer = getattr(layer, "indexer", None)
    if indexer is None:
        shared = bool(getattr(layer, "skip_topk", False))
        raise ArgumentError(f"{who}: expected a layer with its own lightning indexer (an `indexer` attribute); got "
                            + ("a layer that reuses an earlier layer's top-k selection (indexer_types 'shared')"
                               if shared else "a layer without one: MultiHeadLatentAttention.from_transformers "
                                              "converts it"))
    config = layer.config
    if config.q_lora_rank is None:
        raise ArgumentError(f"{who}: the indexer reads the query latent; expected q_lora_rank set, got None")
    pairing = "interleaved" if "Glm" in type(indexer).__name__ else "half"
    module = _latent(cls, layer, top_k=int(indexer.index_topk), index_heads=int(indexer.n_heads),
                     index_dim=int(indexer.head_dim),
                     index_rotary=rotary_from_config(config, config.qk_rope_head_dim, pairing=pairing))
    mine = module.indexer
    for dst, src in ((mine.q_proj, indexer.wq_b), (mine.k_proj, indexer.wk), (mine.w_proj, indexer.weights_proj),
                     (mine.k_norm, indexer.k_norm)):
        _copy(dst, src)
    mine.k_norm.eps = float(indexer.k_norm.eps)
    if not math.isclose(indexer.softmax_scale, indexer.head_dim ** -0.5, rel_tol=1e-12):
        raise ArgumentError(f"{who}: the indexer scales its scores by {indexer.softmax_scale}; expected "
                            f"index_head_dim ** -0.5 = {indexer.head_dim ** -0.5}")
    return module.train(layer.training)


def differential_from_transformers(cls, layer):
    """``cls`` (a :class:`DifferentialAttention`) with a DiffLlama attention layer's configuration and weights."""
    config, who = layer.config, f"DifferentialAttention.from_transformers({_name(layer)})"
    heads, kv_heads, d = config.num_attention_heads, config.num_key_value_heads, layer.head_dim
    if heads % 2 or kv_heads % 2:
        raise ArgumentError(f"{who}: needs even head counts (each differential head pairs two); got "
                            f"num_attention_heads={heads}, num_key_value_heads={kv_heads}")
    if not math.isclose(layer.scaling, d ** -0.5, rel_tol=1e-12):
        raise ArgumentError(f"{who}: the layer scales scores by {layer.scaling}; expected 1 / sqrt(head_dim) = "
                            f"{d ** -0.5}")
    w = layer.o_proj.weight
    module = cls(config.hidden_size, heads // 2, num_kv_heads=kv_heads // 2, lambda_init=float(layer.lambda_init),
                 rotary=rotary_from_config(config, d), bias=layer.o_proj.bias is not None,
                 head_dim=d).to(device=w.device, dtype=w.dtype)
    for name in ("q_proj", "k_proj", "v_proj"):
        _copy(getattr(module, name), getattr(layer, name))
    _copy(module.out_proj, layer.o_proj)
    with torch.no_grad():
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(module, name).copy_(getattr(layer, name))
    module.norm.eps = norm_eps(layer.groupnorm)
    return module.train(layer.training)


MAMBA2_MIXERS = ("Mamba2Mixer", "BambaMixer", "NemotronHMamba2Mixer", "FalconH1Mixer", "GraniteMoeHybridMambaLayer",
                 "Zamba2MambaMixer")


def _mamba2_norm(layer) -> dict:
    norm = layer.norm
    if isinstance(norm, torch.nn.Identity):  # Falcon-H1 without mamba_rms_norm: y * silu(z)
        return {"gated_norm": False}
    return {"eps": norm.variance_epsilon, "norm_before_gate": bool(getattr(norm, "norm_before_gate", False))}


def mamba2_from_transformers(cls, layer):
    """The Mamba-2 mixers of transformers' six Mamba-2 families (mamba2, bamba, nemotron_h, falcon_h1,
    granitemoehybrid, zamba2): the same mixer under their own names, differing in sizes (d_inner from
    ``expand``, heads x head_dim or ``mamba_d_ssm``), biases, the ``dt`` clamp, where the norm sits and,
    for Falcon-H1, two multipliers on the projection, folded into its weights here:
    ``in_proj(m x) * mu = ((mu m) W) x + mu b``."""
    name = type(layer).__name__
    expected = name if name in MAMBA2_MIXERS else " or ".join(MAMBA2_MIXERS)
    transformers_layer("Mamba2Mixer", layer, expected)
    low, high = layer.time_step_limit
    new = cls(layer.hidden_size, head_dim=layer.head_dim, state_dim=layer.ssm_state_size,
              num_groups=layer.n_groups, conv_size=layer.conv_kernel_size, chunk_size=layer.chunk_size,
              inner_dim=layer.intermediate_size, in_bias=layer.in_proj.bias is not None,
              out_bias=layer.out_proj.bias is not None, conv_bias=layer.conv1d.bias is not None,
              dt_limit=(float(low), float(high)), **_mamba2_norm(layer)).to(layer.out_proj.weight)
    weight, bias = layer.in_proj.weight, layer.in_proj.bias
    mup = getattr(layer, "mup_vector", None)
    if mup is not None:  # Falcon-H1: in_proj(x * ssm_in_multiplier) * mup_vector
        mup = mup.reshape(-1, 1).to(weight)
        weight = weight * (mup * float(layer.ssm_in_multiplier))
        bias = None if bias is None else bias * mup[:, 0]
    pairs = [(new.in_proj.weight, weight), (new.conv1d.weight, layer.conv1d.weight), (new.A_log, layer.A_log),
             (new.dt_bias, layer.dt_bias), (new.D, layer.D), (new.out_proj.weight, layer.out_proj.weight)]
    pairs += [(mine, theirs) for mine, theirs in ((new.in_proj.bias, bias), (new.conv1d.bias, layer.conv1d.bias),
                                                  (new.out_proj.bias, layer.out_proj.bias)) if theirs is not None]
    if new.norm is not None:
        pairs.append((new.norm.weight, layer.norm.weight))
    copy_weights(pairs)
    return new
