"""How much a quantized KV cache changes a model's attention: per layer, head and position, and what to keep.

For each softmax self-attention layer of a model, the layer's own queries, keys and values on a
sequence (from the full-precision run, so each layer is measured alone, not with the errors of the
layers below) are attended twice: as they are, and with K and V stored in a
:class:`~attnkit.functional.quantize.KVFormat` (``attnkit.attention(..., k_scale=, v_scale=)``, the
path a quantized cache takes). The error of head ``h`` at position ``i`` of layer ``l`` is the
root mean square over the batch and the head's features of the difference, and its relative form
divides by the root mean square of the full-precision head output there::

    error[l, h, i]    = sqrt(mean_{b, d} (o~[b, h, i, d] - o[b, h, i, d])^2)
    relative[l, h, i] = error[l, h, i] / sqrt(mean_{b, d} o[b, h, i, d]^2)

A layer's score is its mean relative error; for an error ``budget`` the layers to keep at full
precision are those whose score exceeds it (every other layer then stays within the budget).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from ...core import attention
from ...errors import ArgumentError, DTypeError
from ...functional.quantize import KVFormat, as_format
from ...nn.kv_cache import decoding_mask

if TYPE_CHECKING:
    from ...models.self_attention import SoftmaxSelfAttention

__all__ = ["KVQuantReport", "kv_quant_error", "layer_inputs"]


@dataclass(frozen=True)
class KVQuantReport:
    """Attention output error of each layer, head and position under ``kv_format`` (see the module's equations).

    ``error``, ``relative``: float64 ``(layers, heads, positions)``; ``layer_error``: ``(layers,)``, the mean
    relative error of each layer; ``keep``: the layers over ``budget`` (None when no budget was given).
    """

    kv_format: KVFormat
    error: torch.Tensor
    relative: torch.Tensor
    layer_error: torch.Tensor
    budget: float | None
    keep: tuple[int, ...] | None

    def keep_for(self, budget: float) -> tuple[int, ...]:
        """The layers to keep at full precision so that every quantized layer's mean relative error <= budget."""
        return tuple(int(i) for i in torch.nonzero(self.layer_error > budget).flatten())

    def __str__(self) -> str:
        lines = [f"attention output error with a {self.kv_format} KV cache (relative RMS, per layer)"]
        for i, e in enumerate(self.layer_error.tolist()):
            worst = self.relative[i].max().item()
            lines.append(f"  layer {i:>3}: mean {e:.3e}  worst head/position {worst:.3e}")
        if self.budget is not None and self.keep is not None:  # keep is given with a budget
            lines.append(f"keep at full precision for budget {self.budget:g}: {list(self.keep) or 'none'}")
        return "\n".join(lines)


def _attention_layers(who: str, model: nn.Module) -> list[SoftmaxSelfAttention]:
    from ...models.self_attention import SoftmaxSelfAttention  # models import analysis' siblings: late

    layers = [m for m in model.modules() if isinstance(m, SoftmaxSelfAttention)]
    if not layers:
        raise ArgumentError(f"{who}: model has no softmax self-attention layer (SoftmaxSelfAttention) to measure; "
                            f"got {type(model).__name__}")
    return layers


def layer_inputs(model: nn.Module, tokens: torch.Tensor, *, who: str = "layer_inputs"):
    """Each softmax self-attention layer with its input ``(B, n, dim)`` on ``model(tokens)`` (no cache), in order."""
    layers = _attention_layers(who, model)
    seen: dict[int, torch.Tensor] = {}
    hooks = [layer.register_forward_pre_hook(lambda m, args, i=i: seen.__setitem__(i, args[0].detach()))
             for i, layer in enumerate(layers)]
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    return [(layer, seen[i]) for i, layer in enumerate(layers)]


def head_outputs(layer: SoftmaxSelfAttention, x: torch.Tensor, kv_format: KVFormat | None = None) -> torch.Tensor:
    """The layer's per-head attention output ``(B, H, n, Dv)`` on its input ``x`` (before the output projection),
    with K and V as they are or stored in ``kv_format`` (at positions ``0 ..``, as a prefill computes them)."""
    with torch.no_grad():
        q, k, v = layer._project(x, x, x)
        if layer.qk_norm is not None or layer.rotary is not None:
            q, k = layer._position(q, k, 0, 0)
        mask = decoding_mask(layer.causal, layer.pattern, q.shape[2], k.shape[2], None)
        k_scale = v_scale = None
        if kv_format is not None:
            (k, k_scale), (v, v_scale) = kv_format.quantize(k), kv_format.quantize(v)
        return attention(q, k, v, mask=mask, sinks=layer.sinks, k_scale=k_scale, v_scale=v_scale)


def kv_quant_error(model: nn.Module, tokens: torch.Tensor, kv_format, *, budget: float | None = None
                   ) -> KVQuantReport:
    """The error report of ``model``'s attention on ``tokens`` with K and V stored in ``kv_format``.

    Args:
        model: a module holding softmax self-attention layers (``TransformerLM``, a decoder stack), called
            as ``model(tokens)``.
        tokens: its input (token ids ``(B, n)`` for a language model).
        kv_format: a :class:`~attnkit.functional.quantize.KVFormat` or a kind's name.
        budget: the mean relative error a layer may have; the report then names the layers to keep.

    Example:
        >>> import torch
        >>> from attnkit.models import TransformerLM
        >>> lm = TransformerLM(50, dim=32, num_heads=2, num_layers=2, dropout=0.0).eval()
        >>> report = kv_quant_error(lm, torch.randint(0, 50, (1, 12)), "int4", budget=1.0)
        >>> report.error.shape, report.keep
        (torch.Size([2, 2, 12]), ())
    """
    who = "kv_quant_error"
    fmt = as_format(who, kv_format)
    if fmt is None:
        raise DTypeError(f"{who}: kv_format must be a KVFormat or a kind's name; got None")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                               or not math.isfinite(budget) or budget < 0):
        raise ArgumentError(f"{who}: budget must be a finite number >= 0 or None; got {budget!r}")
    errors, relatives = [], []
    for layer, x in layer_inputs(model, tokens, who=who):
        full = head_outputs(layer, x).double()
        diff = head_outputs(layer, x, fmt).double() - full
        err = diff.pow(2).mean(dim=(0, 3)).sqrt()  # (H, n)
        norm = full.pow(2).mean(dim=(0, 3)).sqrt()
        errors.append(err)
        relatives.append(torch.where(norm > 0, err / norm.clamp_min(torch.finfo(torch.float64).tiny), err))
    error, relative = torch.stack(errors), torch.stack(relatives)
    layer_error = relative.mean(dim=(1, 2))
    report = KVQuantReport(fmt, error, relative, layer_error, None if budget is None else float(budget), None)
    if budget is None:
        return report
    return KVQuantReport(fmt, error, relative, layer_error, float(budget), report.keep_for(float(budget)))
