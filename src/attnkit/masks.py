"""Public mask API: ``from attnkit import masks``; see :mod:`attnkit.functional.masks`."""

from .functional.mask_base import And, BlockLayout, Mask, Not, Or
from .functional.mask_parse import parse
from .functional.masks import (
    TensorMask,
    block_layout,
    causal,
    diagonals,
    dilated,
    fixed,
    from_function,
    full,
    global_tokens,
    keys,
    padding,
    prefix_lm,
    segments,
    sliding_window,
    strided,
)
from .functional.shifted import shift_mask as shifted

__all__ = [
    "Mask", "BlockLayout", "And", "Or", "Not", "TensorMask",
    "full", "causal", "sliding_window", "diagonals", "dilated", "strided", "fixed", "global_tokens",
    "block_layout", "segments", "padding", "keys", "prefix_lm", "from_function", "parse",
    "shifted",
]
