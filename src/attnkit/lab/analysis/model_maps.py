"""Attention maps from a transformers model's outputs: the per-layer tuples of ``output_attentions=True``.

A transformers model called with ``output_attentions=True`` returns its post-softmax
weights as one tensor per layer, ``(B, H, Lq, Lk)``, in the output fields ``attentions``
(encoder-only and decoder-only models), ``encoder_attentions``, ``decoder_attentions``
and ``cross_attentions`` (encoder-decoder models). Here they become attnkit maps
``{name: (H, Lq, Lk)}`` of one sample, named ``layers.0``, ``encoder.layers.0``,
``decoder.layers.0``, ``cross.layers.0``, ... (heads are the first axis), with that
sample's padded positions removed. Nothing here imports transformers: an output is
read as a mapping (transformers' ``ModelOutput`` is one) or by attribute.

Alignment: queries are the last ``Lq`` positions of their input (a model decoding over
a KV cache computes ``Lq < Lk`` rows for the newest tokens, bottom-right), keys are
all ``Lk`` positions of theirs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import torch

from ...errors import ArgumentError, DTypeError, ShapeError
from .recorder import AttentionRecorder

__all__ = ["LayerMap", "STACKS", "layer_maps", "recording_from_outputs", "maps_and_tokens", "is_attention_output"]


class Stack(NamedTuple):
    """One field of a model output: its map names and which input its query and key axes follow.

    ``"input"`` is the encoder's (or the only) input: ``tokens`` and ``attention_mask``;
    ``"decoder"`` the decoder's: ``decoder_tokens`` and ``decoder_attention_mask``;
    ``"memory"`` keys of an encoder the output does not describe (left unlabelled, uncropped).
    """

    field: str
    prefix: str
    queries: str
    keys: str


STACKS = (
    Stack("attentions", "layers", "input", "input"),
    Stack("encoder_attentions", "encoder.layers", "input", "input"),
    Stack("decoder_attentions", "decoder.layers", "decoder", "decoder"),
    Stack("cross_attentions", "cross.layers", "decoder", "input"),
)
_MEMORY_CROSS = Stack("cross_attentions", "cross.layers", "input", "memory")  # a decoder-only stack's cross


class LayerMap(NamedTuple):
    """One layer's map of one sample: ``weights (H, Lq, Lk)`` float32 on the CPU, padding removed, and the labels
    of its query and key positions (None where no tokens were given)."""

    name: str
    weights: torch.Tensor
    q_tokens: list[str] | None
    k_tokens: list[str] | None


def _field(outputs, name: str):
    return outputs.get(name) if isinstance(outputs, Mapping) else getattr(outputs, name, None)


def _is_layer_tuple(value) -> bool:
    return isinstance(value, (tuple, list)) and all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in value)


def is_attention_output(value) -> bool:
    """True for a non-empty tuple/list of 4-D tensors, a transformers ``ModelOutput`` (a mapping with ``to_tuple``),
    and any mapping or object holding a tuple in one of the fields of :data:`STACKS`."""
    if isinstance(value, (tuple, list)):
        return bool(value) and _is_layer_tuple(value)
    if isinstance(value, torch.Tensor):
        return False
    if isinstance(value, Mapping) and callable(getattr(value, "to_tuple", None)):
        return True
    return any(isinstance(_field(value, s.field), (tuple, list)) for s in STACKS)


def _stacks(outputs) -> list[tuple[Stack, Sequence[torch.Tensor]]]:
    """The present, non-empty fields with their layer tuples, each tensor checked to be floating (B, H, Lq, Lk)."""
    if isinstance(outputs, (tuple, list)):
        found = [(STACKS[0], outputs)] if outputs else []
    else:
        found = [(s, _field(outputs, s.field)) for s in STACKS if _field(outputs, s.field)]
        if _field(outputs, "encoder_attentions") is None and _field(outputs, "decoder_attentions") is None:
            found = [(_MEMORY_CROSS if s.field == "cross_attentions" else s, v) for s, v in found]
    if not found:
        raise ArgumentError("the model output holds no attention weights: call the model with output_attentions=True "
                            "and load it with attn_implementation=\"eager\" (the sdpa and flash implementations "
                            "return none)")
    batch = None
    for stack, layers in found:
        for i, t in enumerate(layers):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
                raise DTypeError(f"{stack.field}[{i}] must be a floating-point tensor; got {got}")
            if t.dim() != 4 or (batch is not None and t.shape[0] != batch):
                want = "(B, H, Lq, Lk)" if batch is None else f"(B={batch}, H, Lq, Lk) like the layers before"
                raise ShapeError(f"{stack.field}[{i}] must have shape {want}; got {tuple(t.shape)}")
            batch = t.shape[0]
    return found


class _Side(NamedTuple):
    """One input of one sample: which of its positions are real (None: all) and a label per position."""

    keep: torch.Tensor | None  # (L,) bool
    tokens: list[str | None] | None  # one per position (None at padding)


def _side(arg: str, mask, tokens, sample: int, batch: int) -> _Side:
    keep = None
    if mask is not None:
        mask = torch.as_tensor(mask)
        if mask.dim() != 2 or mask.shape[0] != batch:
            raise ShapeError(f"{arg} must have shape (B={batch}, L) (1 = token, 0 = padding); got {tuple(mask.shape)}")
        keep = mask[sample].detach().to("cpu") != 0
    if tokens is None:
        return _Side(keep, None)
    tokens = [str(t) for t in tokens]
    if keep is not None and len(tokens) == int(keep.sum()) != keep.numel():  # labels of the real tokens only
        real = iter(tokens)
        tokens = [next(real) if k else None for k in keep.tolist()]
    if keep is not None and len(tokens) != keep.numel():
        raise ShapeError(f"the tokens of {arg} must number {keep.numel()} (every position) or {int(keep.sum())} "
                         f"(the real ones); got {len(tokens)}")
    return _Side(keep, tokens)


def _axis(side: _Side | None, n: int, what: str, name: str, last: bool) -> tuple[torch.Tensor, list[str] | None]:
    """Indices of the real positions among the ``n`` of one axis, and their labels (queries: the last n)."""
    if side is None:  # keys of an outside memory
        return torch.arange(n), None
    length = side.keep.numel() if side.keep is not None else len(side.tokens) if side.tokens is not None else n
    if n > length or (n < length and not last):
        raise ShapeError(f"map {name!r} has {n} {what} positions but its input has {length}"
                         f"{'' if not last else ' (queries may be the last positions only)'}")
    positions = torch.arange(length - n, length)
    if side.keep is not None:
        positions = positions[side.keep[length - n:]]
    labels = None if side.tokens is None else [side.tokens[p] for p in positions.tolist()]
    return positions - (length - n), labels


def layer_maps(outputs, *, attention_mask=None, decoder_attention_mask=None, tokens=None, decoder_tokens=None,
               sample: int = 0) -> list[LayerMap]:
    """Every layer's map of one sample, padding removed, in the order encoder, decoder, cross.

    Args:
        outputs: a model output (``outputs.attentions`` etc.) or a tuple/list of ``(B, H, Lq, Lk)`` tensors.
        attention_mask: ``(B, L)`` of the (encoder's) input, nonzero at real tokens; None keeps every position.
        decoder_attention_mask: ``(B, L)`` of an encoder-decoder model's decoder input.
        tokens, decoder_tokens: labels of sample ``sample``, one per position or one per real token.
        sample: which batch entry.

    Returns:
        ``[LayerMap(name, (H, Lq', Lk') float32 CPU copy, q_tokens, k_tokens), ...]``.

    Example:
        >>> import torch
        >>> w = torch.softmax(torch.randn(2, 3, 4, 4), -1)
        >>> maps = layer_maps((w, w), attention_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]]), sample=1)
        >>> [(m.name, tuple(m.weights.shape)) for m in maps]
        [('layers.0', (3, 2, 2)), ('layers.1', (3, 2, 2))]
    """
    found = _stacks(outputs)
    batch = found[0][1][0].shape[0]
    if isinstance(sample, bool) or not isinstance(sample, int) or not -batch <= sample < batch:
        raise ArgumentError(f"sample must be an int in [{-batch}, {batch}) (the batch); got {sample!r}")
    sides = {"input": _side("attention_mask", attention_mask, tokens, sample, batch),
             "decoder": _side("decoder_attention_mask", decoder_attention_mask, decoder_tokens, sample, batch),
             "memory": None}
    maps = []
    for stack, layers in found:
        for i, t in enumerate(layers):
            name = f"{stack.prefix}.{i}"
            q, q_tokens = _axis(sides[stack.queries], t.shape[2], "query", name, last=True)
            k, k_tokens = _axis(sides[stack.keys], t.shape[3], "key", name, last=False)
            w = t[sample].detach()[:, q.to(t.device)][:, :, k.to(t.device)]  # (H, Lq', Lk')
            maps.append(LayerMap(name, w.to("cpu", torch.float32, copy=True), q_tokens, k_tokens))
    return maps


def recording_from_outputs(outputs, *, attention_mask=None, decoder_attention_mask=None, tokens=None,
                           decoder_tokens=None, sample: int = 0, source=None) -> AttentionRecorder:
    """:func:`layer_maps` of one sample as an :class:`AttentionRecorder` (maps ``(1, H, Lq, Lk)``, labels in
    ``tokens``): it goes wherever a recording goes (``summary``, ``attnkit.lab.viz``). Arguments as :func:`layer_maps`;
    ``source`` is kept on every map (the model, say).

    Example:
        >>> import torch
        >>> w = torch.softmax(torch.randn(1, 2, 3, 3), -1)
        >>> rec = recording_from_outputs({"attentions": (w,)}, tokens=["a", "b", "c"])
        >>> rec.names(), rec.tokens["layers.0"]
        (['layers.0'], (['a', 'b', 'c'], ['a', 'b', 'c']))
    """
    found = layer_maps(outputs, attention_mask=attention_mask, decoder_attention_mask=decoder_attention_mask,
                       tokens=tokens, decoder_tokens=decoder_tokens, sample=sample)
    return AttentionRecorder.from_maps({m.name: m.weights[None] for m in found}, source=source,
                                       tokens={m.name: (m.q_tokens, m.k_tokens) for m in found})


def maps_and_tokens(maps, who: str, sample: int = 0) -> tuple[dict[str, torch.Tensor], dict[str, tuple]]:
    """Anything a picture or a summary takes, as ``{name: tensor}`` and ``{name: (q_tokens, k_tokens)}``.

    ``maps`` is a mapping name -> tensor (returned as is, no labels), a recorder (its
    ``as_dict(sample)`` and ``tokens``), or a transformers output / tuple of per-layer
    tensors (:func:`layer_maps` of ``sample``, nothing cropped).
    """
    if is_attention_output(maps):
        found = layer_maps(maps, sample=sample)
        return {m.name: m.weights for m in found}, {}
    if hasattr(maps, "as_dict"):
        return maps.as_dict(sample), dict(getattr(maps, "tokens", {}))
    if not isinstance(maps, Mapping) or not maps:
        raise ArgumentError(f"{who}: maps must be a non-empty mapping name -> tensor, an AttentionRecorder, or a "
                            f"transformers model's attentions (a tuple of (B, H, Lq, Lk) tensors); got "
                            f"{type(maps).__name__}")
    return dict(maps), {}
