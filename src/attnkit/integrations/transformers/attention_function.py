"""The attention function a transformers model calls (the ``AttentionInterface`` side).

transformers (5.x) calls ``fn(module, query, key, value, attention_mask, *, dropout,
scaling, **kwargs)`` with ``query (B, H, Lq, D)``, ``key``/``value (B, H_kv, Lk, D)``
(grouped-query heads unexpanded) and expects ``(output (B, Lq, H, Dv), weights or None)``.
``attention_mask`` is what the registered mask function returned (a :class:`ModelMask`),
None (no mask was built: causal when the module is causal, bottom-right), or a user's
own 4-D mask (bool, or float added to the scores; it may be longer than the keys).

Each keyword the model passes is honoured or refused:

* ``scaling`` multiplies the scores (Gemma-2's is not ``1/sqrt(D)``); ``dropout`` is the
  dropout probability on the weights (nonzero in training);
* ``softcap`` caps the scaled scores, ``cap * tanh(s / cap)``, before the mask
  (:func:`attnkit.bias.softcap`); ``position_bias`` (T5-style) is a float bias;
* ``sliding_window`` is already in the mask (the mask function read it from the
  layer's mask function), so it is not applied twice;
* learned attention sinks (gpt-oss's ``s_aux``; ``sinks``), one logit per head in the softmax's
  denominator, or per-token sinks ``(B, H, Lq, 1)`` (a logit per query computed from the hidden
  states, Inkling-2), are passed on as ``attention(..., sinks=)``; names from :func:`register`
  on encoder-decoders are refused with :class:`attnkit.UnsupportedFeature` naming the model
  (cross-attention has no shared positions);
* sparse indexers' key choices (``indices``, ``block_indices``) are AND-ed with the mask and
  read by the gathered path; packed documents (``position_ids`` restarting, ``cu_seq_lens_*``)
  run :func:`attnkit.varlen_attn` (:mod:`.packing`).

The weights are computed (on attnkit's exact dense path) only when the model collects
them: ``output_attentions=True`` reaches the function as a keyword in some models and
only as transformers' output collector in others (GPT-2), so both are read.
"""

from __future__ import annotations

import torch

from ... import bias as attnkit_bias
from ... import masks
from ...bias import ScoreModifier, apply_modifier
from ...core import attention
from ...errors import ShapeError, UnsupportedFeature
from ...functional.shifted import shift_modifier
from ...masks.base import Mask
from .model_mask import ModelMask
from .model_masks import with_extra
from .packing import attend_documents, documents, selection

try:  # where transformers keeps the outputs a forward pass collects (output_attentions without the keyword)
    from transformers.utils.output_capturing import _active_collector
except ImportError:  # pragma: no cover - an older layout: the keyword alone decides
    _active_collector = None

__all__ = ["make_attention_function"]

# Other keywords models pass (position_ids, max_length_*, deterministic) change nothing attnkit computes, or are
# read by .packing (cu_seq_lens_*, indices, block_indices).
_SINKS = ("s_aux", "sinks")  # gpt-oss names its sinks s_aux; other models sinks
# The keywords that change what a call computes beyond its ModelMask (sinks, indexers' choices, packed documents)
_HANDLED = frozenset((*_SINKS, "indices", "block_indices", "cu_seq_lens_q", "cu_seq_lens_k"))


def _model_name(module) -> str:
    config = getattr(module, "config", None)
    kind = getattr(config, "model_type", None)
    return f"{type(module).__name__} ({kind})" if kind else type(module).__name__


def _sinks_of(kwargs) -> torch.Tensor | None:
    """The layer's sinks: one logit per query head ``(H,)``, or per query token ``(B, H, Lq, 1)`` (the column eager
    appends to the scores), given to :func:`attnkit.attention` as ``(B, H, Lq)``."""
    sinks = next((kwargs[name] for name in _SINKS if kwargs.get(name) is not None), None)
    if sinks is not None and sinks.dim() == 4 and sinks.shape[-1] == 1:
        sinks = sinks.squeeze(-1)
    return sinks


def weights_wanted(kwargs) -> bool:
    """True when this forward pass returns attention weights to the user."""
    if kwargs.get("output_attentions"):
        return True
    if _active_collector is None:
        return False
    # Under torch.compile transformers keeps the collector in a plain attribute (dynamo cannot read a ContextVar),
    # set by the model's forward when tracing; before that, nothing collected is being traced.
    if torch.compiler.is_compiling() and not getattr(_active_collector, "compiling", False):
        return False
    collected = _active_collector.get()
    return bool(collected) and any(key.endswith("attentions") for key in collected)


def _float_mask_as_bool(mask: torch.Tensor) -> torch.Tensor:
    """A float mask holding only 0 (attend) and very negative values (masked) as a bool mask, else the float."""
    if torch.compiler.is_compiling():
        return mask  # which it is is data; added to the scores, as eager adds it, it means the same
    low = torch.finfo(mask.dtype).min / 2
    return mask == 0 if bool(((mask == 0) | (mask <= low)).all()) else mask


def _sees_every_key(model_mask: ModelMask, module, is_causal, extra) -> bool:
    """Whether a mask built for fewer keys than the call has still means "every key": a bidirectional layer whose
    mask function restricted nothing (no padding, no pattern, nothing registered). An encoder-style layer run by
    ``generate`` (BERT-generation without ``is_decoder``) fills the cache it is handed while its bidirectional mask
    covers the new tokens only; eager, given no mask, attends to every cached key, and so does this."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", False)
    return model_mask.mask is None and model_mask.packing is None and extra is None and not causal


def model_mask_of(attention_mask, module, is_causal, query, kv_len: int, extra) -> ModelMask:
    """The :class:`ModelMask` of a call; one the mask function did not build is read here (the keys end the
    sequence, as in a dynamic cache) and ``extra`` is AND-ed in, as the mask function would have."""
    if isinstance(attention_mask, ModelMask):
        if kv_len > attention_mask.sizes[2]:
            if _sees_every_key(attention_mask, module, is_causal, extra):
                batch, q_len, _ = attention_mask.sizes
                return ModelMask(None, max(kv_len - q_len, 0), 0, kv_len, shape=(batch, q_len, kv_len),
                                 dtype=attention_mask.dtype, device=attention_mask.device)
            raise UnsupportedFeature(
                f"{_model_name(module)} attends to {kv_len} keys with a mask built for {attention_mask.sizes[2]}: "
                "the model appends keys past the mask (compressed entries) and keeps which queries see them in its "
                "own code (a `block_bias`); use attn_implementation='eager' for this model")
        return attention_mask
    q_len = query.shape[-2]
    if attention_mask is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", False)
        mask = masks.causal() if causal else None
    else:
        mask = attention_mask[..., :kv_len]  # a user's 4-D mask may cover a longer (static) cache
        if mask.is_floating_point():
            mask = _float_mask_as_bool(mask)
            if mask.is_floating_point() and extra is not None:
                raise UnsupportedFeature(f"{_model_name(module)}: an additive float mask cannot be combined with "
                                         "a registered mask; pass a bool mask (True = attend)")
    model_mask = ModelMask(mask, max(kv_len - q_len, 0), 0, kv_len, shape=(query.shape[0], q_len, kv_len),
                           dtype=query.dtype, device=query.device)
    return with_extra(model_mask, extra)


class _Chain(ScoreModifier):
    """Modifiers applied in order (the model's soft-capping, then the registered bias)."""

    def __init__(self, *modifiers):
        self.modifiers = modifiers

    def modify(self, scores, b, h, q_idx, kv_idx, q_len, kv_len):
        for modifier in self.modifiers:
            scores = apply_modifier(modifier, scores, b, h, q_idx, kv_idx, q_len, kv_len)
        return scores

    def __repr__(self):
        return " then ".join(map(repr, self.modifiers))


def _bias_of(module, model_mask: ModelMask, softcap, position_bias, extra):
    """The bias argument: soft-capping, the model's position bias, the registered modifier."""
    modifiers = [attnkit_bias.softcap(float(softcap))] if softcap else []
    if extra is not None:
        modifiers.append(shift_modifier(extra, q0=model_mask.q_offset, k0=model_mask.kv_offset,
                                        q_len=model_mask.length, kv_len=model_mask.length))
    tensors = [position_bias] if position_bias is not None else []
    mask = model_mask.mask
    if torch.is_tensor(mask) and mask.is_floating_point():
        tensors.append(mask)  # an additive float mask that is not only 0 / -inf
    if tensors and modifiers:
        raise UnsupportedFeature(f"{_model_name(module)}: a float bias or mask together with soft-capping or a "
                                 "registered bias is not supported; use attn_implementation='eager'")
    if tensors:
        return tensors[0] if len(tensors) == 1 else tensors[0].float() + tensors[1].float()
    if not modifiers:
        return None
    return modifiers[0] if len(modifiers) == 1 else _Chain(*modifiers)


def _check_heads(module, heads: int, extra_mask, extra_bias) -> None:
    """A registered mask or bias with per-head data (ALiBi's slopes) has one entry per query head of the model.

    :func:`attnkit.attention` checks this itself, but sees them shifted to the block, which hides their heads.
    """
    for what, extra in (("mask", extra_mask), ("bias", extra_bias)):
        held = getattr(extra, "num_heads", None)
        if isinstance(held, int) and held != heads:
            raise ShapeError(f"{_model_name(module)} has {heads} query heads but the registered {what} {extra!r} "
                             f"holds data for {held} heads")


def _plain(attention_mask, key, softcap, position_bias, kwargs) -> bool:
    """Whether the call is one the general path hands to :func:`attnkit.attention` with the :class:`ModelMask`'s
    own mask and nothing else: an attnkit mask (or none) built by the mask function for these keys, no packed
    documents, soft-capping, position bias, sinks, indexers' choices or varlen keywords, and no weights wanted.
    The decoding steps of most models are such calls; the test reads attributes and keyword names only."""
    return (type(attention_mask) is ModelMask and attention_mask.packing is None and not softcap
            and position_bias is None and _HANDLED.isdisjoint(kwargs) and key.shape[-2] <= attention_mask.sizes[2]
            and (attention_mask.mask is None or isinstance(attention_mask.mask, Mask)) and not weights_wanted(kwargs))


def make_attention_function(extra_mask=None, extra_bias=None, backend: str = "auto"):
    """A function for transformers' ``AttentionInterface`` (see the module docstring)."""
    registered = extra_mask is not None or extra_bias is not None

    def attnkit_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
                          softcap=None, position_bias=None, sliding_window=None, **kwargs):
        if not registered and _plain(attention_mask, key, softcap, position_bias, kwargs):
            out = attention(query, key, value, mask=attention_mask.mask, scale=scaling, dropout_p=dropout,
                            return_weights=False, backend=backend)
            return out.transpose(1, 2).contiguous(), None
        sinks = _sinks_of(kwargs)
        _check_heads(module, query.shape[1], extra_mask, extra_bias)
        if (extra_mask is not None or extra_bias is not None) and getattr(
                getattr(module, "config", None), "is_encoder_decoder", False):
            raise UnsupportedFeature(
                f"{_model_name(module)}: a registered mask or bias is read at positions of one sequence, and an "
                "encoder-decoder's cross-attention has two; register() names are for decoder-only and encoder "
                "models")
        model_mask = model_mask_of(attention_mask, module, is_causal, query, key.shape[-2], extra_mask)
        bias = _bias_of(module, model_mask, softcap, position_bias, extra_bias)
        mask = model_mask.mask
        if torch.is_tensor(mask) and mask.is_floating_point():
            mask = None  # it is in the bias
        want_weights = weights_wanted(kwargs)
        chosen = selection(module, kwargs, query.shape[1], _model_name(module))
        if chosen is not None:
            mask = chosen if mask is None else (masks.TensorMask(mask) if torch.is_tensor(mask) else mask) & chosen
        # varlen_attn takes no sinks: packed rows with sinks run as one call under the packed mask (exact)
        docs = None if want_weights or torch.is_tensor(bias) or chosen is not None or sinks is not None else documents(
            model_mask, kwargs, query, key)
        if docs is not None:
            return attend_documents(query, key, value, docs, scale=scaling, dropout=dropout, bias=bias), None
        result = attention(query, key, value, mask=mask, bias=bias, scale=scaling, dropout_p=dropout,
                           return_weights=want_weights, backend=backend, sinks=sinks)
        out, weights = (result.output, result.weights) if want_weights else (result, None)
        return out.transpose(1, 2).contiguous(), weights

    return attnkit_attention
