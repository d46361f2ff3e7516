"""Analytic cost of the linear-recurrent layers: matmul FLOPs per form and the decoding state's bytes.

Plain functions of a built layer (its sizes are its own); FLOPs are the forward pass's matrix
products as ``torch.utils.flop_counter.FlopCounterMode`` counts them on CPU (the tests assert
equality): every ``nn.Linear`` once per token, the short convolution (``2 K`` per channel and
token), and the recurrence (:func:`attnkit.functional.linear.cost.recurrence_flops`). The decoding
state is constant in the length, where softmax attention's KV cache grows by
``2 H d itemsize`` bytes per token and layer.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import DTypeError
from ..functional.linear.cost import recurrence_flops
from ._recurrent import RecurrentLayer

__all__ = ["layer_flops", "state_bytes"]


def _check(layer) -> RecurrentLayer:
    if not isinstance(layer, RecurrentLayer):
        raise DTypeError(f"expected a linear-recurrent layer (RetNetRetention, GatedLinearAttention, Mamba2Mixer, "
                         f"DeltaNet, GatedDeltaNet, KimiDeltaAttention); got {type(layer).__name__}")
    return layer


def layer_flops(layer, length: int, *, batch: int = 1, form: str = "chunk") -> int:
    """Forward matmul FLOPs of ``layer`` on ``(batch, length, dim)`` in ``form``."""
    layer = _check(layer)
    tokens = batch * length
    flops = sum(2 * tokens * m.in_features * m.out_features for m in layer.modules() if isinstance(m, nn.Linear))
    conv = getattr(layer, "conv1d", None)
    if conv is not None:
        flops += 2 * tokens * conv.weight.shape[0] * conv.weight.shape[-1]
    heads, dk, dv = layer.core_sizes
    return flops + recurrence_flops(form, batch=batch, heads=heads, length=length, key_dim=dk, value_dim=dv,
                                    chunk_size=layer.chunk_size, delta=layer.delta_rule)


def state_bytes(layer, *, batch: int = 1) -> int:
    """Bytes of a full :class:`~attnkit.nn.RecurrentCache` of ``layer`` for ``batch`` sequences, any length.

    The recurrence's state ``H Dk Dv`` in float32 (float64 for a float64 layer) plus the short
    convolution's last ``K - 1`` inputs per channel in the layer's dtype.
    """
    layer = _check(layer)
    dtype = next(layer.parameters()).dtype
    heads, dk, dv = layer.core_sizes
    total = heads * dk * dv * torch.promote_types(dtype, torch.float32).itemsize
    conv = getattr(layer, "conv1d", None)
    if conv is not None:
        total += conv.weight.shape[0] * (conv.weight.shape[-1] - 1) * dtype.itemsize
    return batch * total
