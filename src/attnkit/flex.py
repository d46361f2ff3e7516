"""``attnkit.flex_attention``: torch's FlexAttention API, trainable on the CPU.

FlexAttention (Dong et al. 2024, "Flex Attention: A Programming Model for Generating
Optimized Attention Kernels", arXiv:2412.05496) is where PyTorch users write custom
masks (``mask_mod`` in a ``BlockMask`` from ``create_block_mask``) and score
modifiers (``score_mod``)::

    out = softmax(score_mod(q k^T * scale, b, h, q_idx, kv_idx) where the block mask allows) @ v

torch's own implementation raises on a CPU backward. :func:`flex_attention` takes the
same arguments, torch's ``BlockMask`` and ``score_mod`` functions unchanged, and:

- on the CPU (and MPS) computes the forward and the backward through attnkit's paths:
  the block mask becomes an attnkit mask (:func:`attnkit.masks.from_block_mask`: its
  tiles are the block layout the block-sparse paths skip by, its ``mask_mod`` decides
  the partial tiles) and the score_mod is the call's modifier (it is called with
  broadcasting index tensors rather than scalars, which the elementwise functions
  FlexAttention takes do unchanged). Tensors a score_mod captures that require grad
  (a learned bias table) get their gradients;
- on CUDA and other devices calls torch's FlexAttention, compiled once per process
  (the plain function inside a graph being compiled).

A block mask is answered as torch's compiled kernel answers it: a full tile allows every
entry, a partial tile asks ``mask_mod`` with the call's own ``b`` and ``h``. A ``BlockMask``
built with ``B=None`` or ``H=None`` holds the tiles of ``b = 0`` / ``h = 0`` for every batch
and head, so a ``mask_mod`` that reads ``b`` or ``h`` is asked only inside the partial tiles
of that layout (torch's eager CPU path, which asks it everywhere, then differs; build the
block mask with the batch and heads, ``B=batch, H=heads``, for a per-batch or per-head mask).

A row with no allowed key gives 0 and lse ``-inf`` on both. ``kernel_options`` tunes
torch's generated kernels and is passed to them on CUDA; attnkit's paths choose their
own tiles. The lse is the natural log-sum-exp, float32 (float64 for float64 inputs).

transformers: its ``"flex_attention"`` implementation calls torch's kernel and so cannot
train on the CPU. :func:`register_transformers` registers this function beside it, under a
name of its own (``"attnkit_flex"``: transformers' own is left as it is): the same block
masks transformers builds for FlexAttention, computed here, so a model made with
``attn_implementation="attnkit_flex"`` trains on the CPU. (``attn_implementation="attnkit"``,
:mod:`attnkit.integrations.transformers`, reads the models' masks itself instead.)

Shapes: query ``(B, Hq, L, E)``, key ``(B, Hkv, S, E)``, value ``(B, Hkv, S, Ev)``;
output ``(B, Hq, L, Ev)``, lse ``(B, Hq, L)``.
"""

from __future__ import annotations

import torch

from .core import attention
from .errors import ArgumentError, ShapeError, UnsupportedFeature
from .masks import cache
from .masks.flex_tiles import from_block_mask

__all__ = ["flex_attention", "transformers_attention", "register_transformers", "ATTNKIT_DEVICES"]

ATTNKIT_DEVICES = ("cpu", "mps")  # where torch's FlexAttention has no backward: attnkit's paths compute it
_WHO = "attnkit.flex_attention"


def _check_heads(query, key, value, enable_gqa: bool) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ShapeError(f"{_WHO}: {name} must be a 4-D tensor (B, H, L, E); got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    hq, hkv = query.shape[1], key.shape[1]
    if not enable_gqa and hq != hkv:
        raise ShapeError(f"{_WHO}: query and key/value heads differ ({hq} and {hkv}); pass enable_gqa=True for "
                         "grouped-query attention")
    if enable_gqa and (hkv == 0 or hq % hkv):
        raise ShapeError(f"{_WHO}: query heads must be a multiple of key/value heads; got {hq} and {hkv}")


def _attnkit_mask(block_mask):
    """The block mask as an attnkit mask, made once per block mask (and kept on it, so its layouts are reused)."""
    if block_mask is None:
        return None
    return cache.on(block_mask, "attnkit_mask", max_entries=1).get_or_build("mask", lambda: from_block_mask(block_mask))


def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                   return_lse=False, kernel_options=None, *, return_aux=None):
    """FlexAttention with torch's signature; forward and backward on the CPU through attnkit.

    Args:
        query: ``(B, Hq, L, E)``.
        key: ``(B, Hkv, S, E)``.
        value: ``(B, Hkv, S, Ev)``.
        score_mod: ``(score, b, h, q_idx, kv_idx) -> score``, or None.
        block_mask: a ``torch.nn.attention.flex_attention.BlockMask`` for ``L x S``, or None (every key).
        scale: multiplies ``q . k``; default ``1 / sqrt(E)``.
        enable_gqa: allow ``Hq`` a multiple of ``Hkv`` (grouped-query attention).
        return_lse: also return the lse (torch's older spelling of ``return_aux=AuxRequest(lse=True)``).
        kernel_options: options of torch's generated kernels (used on CUDA only).
        return_aux: ``AuxRequest(lse=True)``: also return ``AuxOutput(lse=...)``; ``max_scores`` is refused on the CPU.

    Returns:
        The output ``(B, Hq, L, Ev)``; with ``return_lse`` ``(output, lse)``; with ``return_aux``
        ``(output, AuxOutput)``.

    Example:
        >>> import torch, attnkit
        >>> from torch.nn.attention.flex_attention import create_block_mask
        >>> q, k, v = (torch.randn(1, 2, 256, 16, requires_grad=True) for _ in range(3))
        >>> causal = create_block_mask(lambda b, h, i, j: i >= j, None, None, 256, 256, device="cpu")
        >>> out = attnkit.flex_attention(q, k, v, block_mask=causal, score_mod=lambda s, b, h, i, j: s + (j - i) / 64)
        >>> out.sum().backward()  # torch's own flex_attention raises here on the CPU
        >>> q.grad.shape
        torch.Size([1, 2, 256, 16])
    """
    if return_lse and return_aux is not None:
        raise ArgumentError(f"{_WHO}: give return_lse or return_aux, not both")
    if isinstance(query, torch.Tensor) and query.device.type not in ATTNKIT_DEVICES:
        from .kernels.flex import kernel
        return kernel()(query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scale,
                        enable_gqa=enable_gqa, return_lse=return_lse, kernel_options=kernel_options,
                        return_aux=return_aux)
    if return_aux is not None and getattr(return_aux, "max_scores", False):
        raise UnsupportedFeature(f"{_WHO}: return_aux=AuxRequest(max_scores=True) is computed by torch's kernels "
                                 "only (CUDA); on the CPU ask for the lse")
    _check_heads(query, key, value, enable_gqa)
    want_lse = bool(return_lse or (return_aux is not None and return_aux.lse))
    result = attention(query, key, value, mask=_attnkit_mask(block_mask), bias=score_mod, scale=scale,
                       return_lse=want_lse)
    if return_aux is not None:
        from torch.nn.attention.flex_attention import AuxOutput
        return (result.output, AuxOutput(lse=result.lse)) if want_lse else (result, AuxOutput())
    return (result.output, result.lse) if want_lse else result


def transformers_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                           position_bias=None, **kwargs):
    """transformers' attention function (``AttentionInterface``) on :func:`flex_attention`.

    Takes what transformers passes its ``"flex_attention"`` implementation: the block mask
    (or None), the scaling, a soft-cap and a position bias (as the score_mod); returns the
    output ``(B, L, H, Dv)`` and no weights. Dropout and attention sinks are refused.
    """
    if dropout or kwargs.get("s_aux") is not None:
        raise UnsupportedFeature(f"{_WHO}: transformers' attention with dropout or attention sinks; use "
                                 "attn_implementation='attnkit'")
    if attention_mask is not None and not hasattr(attention_mask, "kv_num_blocks"):
        raise UnsupportedFeature(f"{_WHO}: transformers passed a {type(attention_mask).__name__} mask; register "
                                 "transformers' flex_attention_mask with this function (register_transformers)")

    def score_mod(score, b, h, q_idx, kv_idx):
        if softcap is not None:
            score = softcap * torch.tanh(score / softcap)
        if position_bias is not None:
            score = score + position_bias[b, h, q_idx, kv_idx]
        return score
    out = flex_attention(query, key, value, score_mod=None if softcap is None and position_bias is None else score_mod,
                         block_mask=attention_mask, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def register_transformers(name: str = "attnkit_flex") -> str:
    """Register :func:`transformers_attention` and transformers' own FlexAttention masks under ``name``.

    Then ``AutoModel.from_config(config, attn_implementation=name)`` builds FlexAttention's
    block masks as transformers does and trains on the CPU. Returns ``name``.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flex_attention_mask

    AttentionInterface.register(name, transformers_attention)
    AttentionMaskInterface.register(name, flex_attention_mask)
    return name
