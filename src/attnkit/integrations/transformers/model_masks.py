"""The mask a transformers model asks for, as an attnkit mask (the ``AttentionMaskInterface`` side).

transformers (5.x) describes a layer's mask as a predicate ``mask_function(b, h, q, kv)``
over positions in the whole sequence, plus a 2-D padding mask ``(B, seen + Lq)`` and the
block the layer computes: queries from ``q_offset``, ``kv_length`` keys from ``kv_offset``
(a KV cache, a sliding-window cache that keeps only the last window). It calls the
registered mask function with keywords only and hands whatever it returns to the
attention function unchanged.

Here the predicate is read back as an attnkit mask: the functions transformers builds
its causal, bidirectional and sliding-window masks from are recognised (by their code,
through ``and_masks``/``or_masks``), become :func:`attnkit.masks.diagonals` bands on the
whole sequence, and are shifted to the block, so a plain causal layer keeps attnkit's
O(1) causal path and a sliding-window layer its band path. A predicate that is not
recognised (chunked attention, a model's own overlay) is evaluated by transformers' own
``sdpa_mask`` into a dense bool tensor: exact, only not sparse. Packed sequences (``position_ids``
restarting in one row) are recognised too: documents as :func:`attnkit.masks.segments` AND the
layer's own mask inside each, and, for a whole row without padding, a :class:`Packing` that sends
the layer to :func:`attnkit.varlen_attn`.

Under ``torch.compile`` nothing here reads data: a padding mask is kept whether or not it pads
(that is data), and a mask function built while tracing (windows, combinations: dynamo reads no
closure of such a function) or a static cache's tensor offsets take the dense, exact form.
"""

from __future__ import annotations

from functools import reduce
from typing import NamedTuple

import torch
from transformers import masking_utils as hf_masks

from ... import masks
from ...masks import _Diagonals
from ...masks.base import Mask
from .model_mask import ModelMask

__all__ = ["make_mask_function", "whole_sequence_mask", "with_extra", "Packing", "packing", "EXTEND_THE_MASK"]

# Families whose layers append keys past the mask and extend a mask *tensor* with those keys' visibility, in their own
# code: DeepSeek-V4's compressed keys, with a per-query additive `block_bias` (its causality and the indexer's top-k
# choice) that the layer concatenates to the mask only when the mask is a torch.Tensor. They are handed transformers'
# eager mask itself: the layer extends it, and the attention function adds the extended mask to the scores (exact;
# the call is a dense one, as the model's own code makes it).
EXTEND_THE_MASK = frozenset({"deepseek_v4"})


def _free_vars(fn) -> dict | None:
    """The values a closure captured; None where they cannot be read (torch.compile's dynamo reads no closure
    of a function created while tracing: the mask then counts as unknown, and transformers evaluates it)."""
    try:
        cells = fn.__closure__ or ()
    except AttributeError:
        return None
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in cells), strict=True))


_AND = hf_masks.and_masks(hf_masks.causal_mask_function).__code__
_OR = hf_masks.or_masks(hf_masks.causal_mask_function).__code__
_WINDOW = hf_masks.sliding_window_overlay(1).__code__
_TWO_SIDED_WINDOW = hf_masks.sliding_window_bidirectional_overlay(1).__code__
_PACKED = hf_masks.packed_sequence_mask_function(torch.zeros(1, 1)).__code__
_REMAP = hf_masks.remap_positions_for_packed_sequence(hf_masks.causal_mask_function, torch.zeros(1, 1)).__code__


class Packing(NamedTuple):
    """Documents packed in a row: the document of each position ``(L,)`` and the mask inside each document."""

    ids: torch.Tensor
    within: Mask | None


def _parts(functions, packed: bool) -> list[Mask | None]:
    """The attnkit masks of an AND's parts. Beside transformers' packed-sequence mask, a mask function read at
    positions inside each document (``remap_positions_for_packed_sequence``) is its own mask: positions rise
    by one inside a document, so differences of positions there are differences of indices."""
    parts = []
    for f in functions:
        code = getattr(f, "__code__", None)
        captured = _free_vars(f) if packed and code in (_PACKED, _REMAP) else None
        if captured is None:
            parts.append(whole_sequence_mask(f))
        elif code is _PACKED:
            parts.append(masks.segments(captured["packed_sequence_mask"]))
        else:
            parts.append(whole_sequence_mask(captured["mask_function"]))
    return parts


def _packed(functions) -> bool:
    return any(getattr(f, "__code__", None) is _PACKED for f in functions)


def packing(mask_function) -> Packing | None:
    """The documents and the mask inside them when ``mask_function`` is transformers' packed-sequence mask
    AND a layer mask attnkit reads (one row: the ids of the batch's first row); None otherwise."""
    captured = _free_vars(mask_function) if getattr(mask_function, "__code__", None) is _AND else None
    if captured is None or not _packed(captured["mask_functions"]):
        return None
    inside = [f for f in captured["mask_functions"] if getattr(f, "__code__", None) is not _PACKED]
    parts = _parts(inside, True)
    ids = next(_free_vars(f)["packed_sequence_mask"] for f in captured["mask_functions"]
               if getattr(f, "__code__", None) is _PACKED)
    if None in parts:
        return None
    within = _combine(parts, both=True) if parts else None
    return Packing(ids[0], None if within is None or within.kind == "full" else within)


def _combine(parts: list[Mask], both: bool) -> Mask:
    """AND (``both``) or OR of masks; an AND of bands is one band (``And.band`` intersects them)."""
    def pair(a, b):
        if not both:
            return a | b
        if isinstance(a, _Diagonals) and isinstance(b, _Diagonals):
            return masks.diagonals(*(a & b).band(0, 0))
        return a & b
    return reduce(pair, parts)


# Masks are immutable: the two most models ask for on every forward pass are built once.
_CAUSAL = masks.diagonals(hi=0)  # key position <= query position
_CAUSAL_FUNCTION = hf_masks.causal_mask_function
_FULL = masks.full()


def whole_sequence_mask(mask_function) -> Mask | None:
    """The attnkit mask, on positions of the whole sequence, of a transformers mask function (None: unknown)."""
    if mask_function is hf_masks.causal_mask_function:
        return _CAUSAL
    if mask_function is hf_masks.bidirectional_mask_function:
        return _FULL
    code = getattr(mask_function, "__code__", None)
    captured = _free_vars(mask_function) if code in (_WINDOW, _TWO_SIDED_WINDOW, _AND, _OR) else None
    if captured is None:
        return None
    if code is _WINDOW:
        return masks.diagonals(lo=1 - captured["sliding_window"])  # kv > q - w
    if code is _TWO_SIDED_WINDOW:
        w = captured["sliding_window"]
        return masks.diagonals(-w, w)  # |q - kv| <= w
    functions = captured["mask_functions"]
    parts = _parts(functions, code is _AND and _packed(functions))
    return None if None in parts else _combine(parts, both=code is _AND)


_BOTTOM_RIGHT = masks.causal()


def _below(hi: int, q_length: int, kv_length: int) -> Mask | None:
    """The block's keys ``j - i <= hi`` (block indices), in the form with the fastest attnkit path."""
    if hi >= kv_length - 1:
        return None  # every key: a decoding step over its whole cache
    if hi == kv_length - q_length:
        return _BOTTOM_RIGHT  # the O(1) causal path
    return masks.diagonals(hi=hi)


def _on_block(whole: Mask, q_length: int, kv_length: int, q_offset: int, kv_offset: int, length: int):
    """The whole-sequence mask on the block, in the form with the fastest attnkit path."""
    band = whole.band(length, length)
    if band is not None:
        lo, hi = (None if end is None else end + q_offset - kv_offset for end in band)
        lo = None if lo is not None and lo <= 1 - q_length else lo  # drop a side that cuts no entry of the block
        if lo is None:
            return None if hi is None else _below(hi, q_length, kv_length)
        return masks.diagonals(lo, None if hi is not None and hi >= kv_length - 1 else hi)
    return masks.shifted(whole, q0=q_offset, k0=kv_offset, q_len=length, kv_len=length)


def _block_padding(attention_mask, kv_length: int, kv_offset: int) -> torch.Tensor | None:
    """The keys of the block the 2-D padding mask keeps, ``(B, kv_length)``; None when it keeps all."""
    if attention_mask is None:
        return None
    keep = attention_mask.to(torch.bool)
    short = kv_offset + kv_length - keep.shape[-1]
    if short > 0:  # transformers pads a short padding mask with "padded" (False) keys
        keep = torch.nn.functional.pad(keep, (0, short), value=False)
    keep = keep[:, kv_offset:kv_offset + kv_length]
    if torch.compiler.is_compiling():
        return keep  # whether it keeps every key is data, which a traced graph cannot branch on
    return None if bool(keep.all()) else keep


def _structured_block(whole: Mask, q_length: int, kv_length: int, q_offset: int, kv_offset: int, length: int,
                      attention_mask) -> Mask | None:
    """The block's attnkit mask: the whole-sequence mask on the block, AND the keys the padding mask keeps."""
    block = _on_block(whole, q_length, kv_length, q_offset, kv_offset, length)
    keep = _block_padding(attention_mask, kv_length, kv_offset)
    if keep is None:
        return block
    pad = masks.keys(keep)
    return pad if block is None else block & pad


def with_extra(model_mask: ModelMask, extra: Mask | None) -> ModelMask:
    """``model_mask`` AND ``extra``, a mask on whole-sequence positions evaluated on the block."""
    if extra is None:
        return model_mask
    mine = masks.shifted(extra, q0=model_mask.q_offset, k0=model_mask.kv_offset, q_len=model_mask.length,
                         kv_len=model_mask.length)
    block = model_mask.mask
    if torch.is_tensor(block):
        block = masks.TensorMask(block)
    return model_mask.with_mask(mine if block is None else block & mine)


def _model_type(config) -> str | None:
    """The config's ``model_type``, read from its class (transformers declares it there) before the instance: a
    config's own attribute lookup runs Python on every read, and this runs once per forward pass."""
    return getattr(type(config), "model_type", None) or getattr(config, "model_type", None)


def make_mask_function(extra: Mask | None = None):
    """A function for ``AttentionMaskInterface``; ``extra`` (on whole-sequence positions) is AND-ed in."""

    def attnkit_mask(*, batch_size, q_length, kv_length, q_offset=0, kv_offset=0,
                     mask_function=hf_masks.causal_mask_function, attention_mask=None, device="cpu",
                     use_vmap=False, dtype=torch.float32, config=None, **_ignored) -> ModelMask | torch.Tensor:
        if isinstance(attention_mask, ModelMask):  # prepared for this very call by generate()
            return attention_mask
        if (mask_function is _CAUSAL_FUNCTION and attention_mask is None and extra is None
                and type(q_offset) is int and type(kv_offset) is int):
            # a causal layer without padding, as most decoding steps are: what the general route below gives, read
            # from the causal band directly (every step of every forward pass comes here)
            model_mask = ModelMask(_below(q_offset - kv_offset, q_length, kv_length), q_offset, kv_offset,
                                   max(q_offset + q_length, kv_offset + kv_length),
                                   shape=(batch_size, q_length, kv_length), dtype=dtype, device=device)
            return model_mask.dense() if _model_type(config) in EXTEND_THE_MASK else model_mask
        whole = whole_sequence_mask(mask_function)
        # A static cache gives its offsets as tensors: read once in eager code; traced, they stay tensors (their
        # values are data), the mask is transformers' evaluated at them, and the cache holds the whole sequence.
        traced = torch.compiler.is_compiling() and (torch.is_tensor(q_offset) or torch.is_tensor(kv_offset))
        if traced:
            length = kv_offset + kv_length
        else:
            q_offset, kv_offset = int(q_offset), int(kv_offset)
            length = max(q_offset + q_length, kv_offset + kv_length)
        if whole is not None and not traced:
            block = _structured_block(whole, q_length, kv_length, q_offset, kv_offset, length, attention_mask)
        else:  # not a pattern attnkit knows: transformers evaluates it, exactly, as a dense bool tensor
            block = hf_masks.sdpa_mask(
                batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                allow_is_causal_skip=False, allow_is_bidirectional_skip=False, use_vmap=use_vmap, device=device)
        packed = None
        if whole is not None and not traced and batch_size == 1 and q_offset == kv_offset == 0 and (
                q_length == kv_length and extra is None and _block_padding(attention_mask, kv_length, 0) is None):
            packed = packing(mask_function)  # one whole row of documents: the varlen call
        model_mask = ModelMask(block, q_offset, kv_offset, length, shape=(batch_size, q_length, kv_length),
                               dtype=dtype, device=device, packing=packed)
        model_mask = with_extra(model_mask, extra)
        if _model_type(config) in EXTEND_THE_MASK:
            return model_mask.dense()
        return model_mask

    return attnkit_mask
