"""The x-transformers options of :class:`~attnkit.nn.multihead.MultiHeadAttention`: parameters, checks, dispatch.

Each option calls its one function in :mod:`attnkit.functional` (the formula's home); this file only
holds the learned parameters, refuses what does not compose, and adapts the module's masks to the
function's arguments:

- ``talking_heads``: :func:`~attnkit.functional.talking_heads.talking_heads_attention`; parameters
  ``pre_talking_heads`` / ``post_talking_heads`` ``(H, H)``, initialised to the identity.
- ``num_memory_kv=M``: :func:`~attnkit.functional.memory_kv.memory_kv_attention`; ``memory_k``,
  ``memory_v`` ``(Hkv, M, d)``, standard normal (as x-transformers).
- ``value_residual``: :func:`~attnkit.functional.value_residual.value_residual`; for ``"learned"``,
  ``value_residual_mix`` a ``Linear(vdim, Hkv)`` (torch's initialisation) whose sigmoid is the mix.
- ``selective``: :func:`~attnkit.functional.selective.selective_attention` (head 0 selects); none.
- ``cope=P``: :func:`~attnkit.functional.cope.cope_attention`; ``cope_positions`` ``(P, d)``, zeros.
- ``topk=k``: :func:`~attnkit.functional.topk.topk_attention`; none.
- ``scores="l2"``: :func:`~attnkit.functional.distance.l2_distance_attention`; none.
- ``laser``: :func:`~attnkit.functional.laser.laser_attention`; none.

At most one option that runs the attention (all but ``value_residual``, which only changes the
values) per module: each function makes its own call of :func:`attnkit.attention`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ArgumentError, check_int
from ..functional.cope import cope_attention
from ..functional.distance import l2_distance_attention
from ..functional.laser import laser_attention
from ..functional.memory_kv import memory_kv_attention
from ..functional.selective import selective_attention
from ..functional.talking_heads import talking_heads_attention
from ..functional.topk import topk_attention
from ..functional.value_residual import value_residual

_TALKING = (None, "pre", "post", "both")


def configure(module, who: str, *, talking_heads=None, num_memory_kv: int = 0, value_residual=False,
              selective: bool = False, cope: int | None = None, topk: int | None = None, scores: str = "dot",
              laser: bool = False, device=None, dtype=None) -> None:
    """Check the options and give ``module`` their parameters (``None`` where an option is off)."""
    fk = {"device": device, "dtype": dtype}
    h, hkv, d = module.num_heads, module.num_kv_heads, module.head_dim
    if talking_heads not in _TALKING:
        raise ArgumentError(f"{who}: talking_heads must be None, 'pre', 'post' or 'both'; got {talking_heads!r}")
    check_int(who, "num_memory_kv", num_memory_kv, 0)
    if value_residual not in (False, True, "learned"):
        raise ArgumentError(f"{who}: value_residual must be False, True (mix 0.5) or 'learned'; got {value_residual!r}")
    for name, value in (("selective", selective), ("laser", laser)):
        if not isinstance(value, bool):
            raise ArgumentError(f"{who}: {name} must be a bool; got {value!r}")
    if cope is not None:
        check_int(who, "cope", cope, 1, " (the number of positions) or None")
    if topk is not None:
        check_int(who, "topk", topk, 1, " (keys kept per query) or None")
    if scores not in ("dot", "l2"):
        raise ArgumentError(f"{who}: scores must be 'dot' or 'l2'; got {scores!r}")
    chosen = [name for name, on in (("talking_heads", talking_heads is not None), ("num_memory_kv", num_memory_kv > 0),
                                    ("selective", selective), ("cope", cope is not None), ("topk", topk is not None),
                                    ("scores='l2'", scores == "l2"), ("laser", laser)) if on]
    if len(chosen) > 1:
        raise ArgumentError(f"{who}: {' and '.join(chosen)} do not compose: each runs the attention through its own "
                            "function; choose one (value_residual combines with any)")
    module.attention_option = chosen[0] if chosen else None
    module.talking_heads, module.topk, module.scores, module.laser = talking_heads, topk, scores, laser
    module.selective = selective
    params = {"pre_talking_heads": torch.eye(h, **fk) if talking_heads in ("pre", "both") else None,
              "post_talking_heads": torch.eye(h, **fk) if talking_heads in ("post", "both") else None,
              "memory_k": torch.randn(hkv, num_memory_kv, d, **fk) if num_memory_kv else None,
              "memory_v": torch.randn(hkv, num_memory_kv, d, **fk) if num_memory_kv else None,
              "cope_positions": None if cope is None else torch.zeros(cope, d, **fk)}
    for name, init in params.items():
        module.register_parameter(name, None if init is None else nn.Parameter(init))
    module.value_residual = value_residual
    module.value_residual_mix = nn.Linear(module.vdim, hkv, **fk) if value_residual == "learned" else None


def set_defaults(module) -> None:
    """Every option off, for a module unpickled from before the options existed."""
    for name in ("talking_heads", "topk", "attention_option"):
        module.__dict__.setdefault(name, None)
    module.__dict__.setdefault("scores", "dot")
    for name in ("laser", "selective", "value_residual"):
        module.__dict__.setdefault(name, False)
    for name in ("pre_talking_heads", "post_talking_heads", "memory_k", "memory_v", "cope_positions"):
        module._parameters.setdefault(name, None)
    module._modules.setdefault("value_residual_mix", None)


def any_on(module) -> bool:
    return module.attention_option is not None or bool(module.value_residual)


def describe(module) -> str:
    """The options that are on, for ``extra_repr``."""
    parts = [f"talking_heads={module.talking_heads!r}" if module.talking_heads else "",
             f"num_memory_kv={module.memory_k.shape[1]}" if module.memory_k is not None else "",
             f"value_residual={module.value_residual!r}" if module.value_residual else "",
             "selective=True" if module.selective else "",
             f"cope={module.cope_positions.shape[0]}" if module.cope_positions is not None else "",
             f"topk={module.topk}" if module.topk is not None else "",
             "scores='l2'" if module.scores == "l2" else "", "laser=True" if module.laser else ""]
    return "".join(", " + p for p in parts if p)


def mix_values(module, who: str, v, value_input, first, batched: bool):
    """The values the layer attends over: ``v`` itself, or mixed with the first layer's ``first``."""
    if first is None:
        return v
    if not module.value_residual:
        raise ArgumentError(f"{who}: value_residual= needs a module built with value_residual=True or 'learned'")
    if isinstance(first, torch.Tensor) and not batched:
        first = first[None]
    if module.value_residual_mix is None:
        return value_residual(v, first, 0.5)
    mix = torch.sigmoid(module.value_residual_mix(value_input)).transpose(1, 2)[..., None]  # (B, Hkv, S, 1)
    return value_residual(v, first, mix)


def check_call(module, who: str, *, need_weights: bool, mask=None, bias=None, n_extra: int = 0,
               decoding: bool = False, quantized: bool = False) -> None:
    """Refuse, with the reason, a call that the module's attention option cannot serve."""
    option = module.attention_option
    if option is None:
        return
    if quantized:
        raise ArgumentError(f"{who}: {option} reads the keys and values themselves; a quantized KV cache holds codes. "
                            "Use a full-precision cache (kv_format=None)")
    if need_weights and option in ("talking_heads", "laser"):
        raise ArgumentError(f"{who}: {option} has no single attention map to return (talking heads mix the weights "
                            "of every head; LASER averages exp(V)); pass need_weights=False")
    if option in ("selective", "cope"):
        if decoding:
            raise ArgumentError(f"{who}: {option} has no incremental form here (it needs every query's whole row of "
                                "logits over the sequence); run forward on the whole sequence with is_causal=True")
        if n_extra or bias is not None or module.extra_mask is not None or getattr(mask, "kind", None) != "causal":
            raise ArgumentError(f"{who}: {option} is causal self-attention with its own mask; call it with "
                                "is_causal=True and no other mask, bias or extra keys (add_bias_kv, add_zero_attn)")
    if option == "topk" and bias is not None:
        raise ArgumentError(f"{who}: topk selects on the scaled dot products; a float attn_mask (a bias) is not "
                            "supported, give a bool mask")


def attend(module, q, k, v, *, mask, bias, options: dict):
    """The attention of the module's option (``options``: dropout_p, return_weights, sinks, scale)."""
    option = module.attention_option
    extra = {"mask": mask} if mask is not None else {}
    if bias is not None:
        extra["bias"] = bias
    if option == "talking_heads":
        groups = q.shape[1] // k.shape[1]
        if groups > 1:  # the mixes read every head: each query head's own key/value head
            k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
        return talking_heads_attention(q, k, v, pre=module.pre_talking_heads, post=module.post_talking_heads,
                                       **extra, **options)
    if option == "num_memory_kv":
        if bias is not None:  # the memory columns come first, with no bias
            extra["bias"] = F.pad(bias, (module.memory_k.shape[1], 0))
        return memory_kv_attention(q, k, v, module.memory_k, module.memory_v, **extra, **options)
    if option == "selective":
        return selective_attention(q, k, v, **options)
    if option == "cope":
        return cope_attention(q, k, v, module.cope_positions, **options)
    if option == "topk":
        return topk_attention(q, k, v, module.topk, **extra, **options)
    if option == "scores='l2'":
        return l2_distance_attention(q, k, v, **extra, **options)
    return laser_attention(q, k, v, **extra, **options)
