"""Masks and score modifiers of the benchmark suite, built from short texts.

A benchmark case names its mask as text so that a row of the suite can be cached,
printed and reproduced with ``attnkit bench --mask ...``. Besides everything
:func:`attnkit.masks.parse` reads, three patterns that need the sequence length
are understood (each alone, not combined with ``& | ~``):

- ``documents(n)``: ``n`` equal documents packed in one sequence (``masks.segments``).
- ``bigbird(block, window, globals, random, seed)``: a BigBird-like block layout
  (band of ``window`` blocks, ``globals`` global block rows/columns, ``random``
  random key blocks per query block, drawn with ``seed``).
- ``longformer(window, globals)``: ``sliding_window(window, window) | global_tokens(range(globals))``.

Biases: ``alibi`` (paper slopes), ``relpos`` (T5 buckets, a seeded table),
``softcap`` (cap 50, as Gemma 2's attention logits); the first two are additive
and have a dense float equivalent, soft-capping does not.
"""

from __future__ import annotations

import ast
import re

import torch

from ... import bias as _bias
from ... import masks as _masks
from ...errors import ArgumentError
from ...masks.base import Mask

__all__ = ["BIASES", "ADDITIVE_BIASES", "make_mask", "make_bias", "dense_bias", "active_pairs"]

BIASES = ("alibi", "relpos", "softcap")
ADDITIVE_BIASES = ("alibi", "relpos")
_EXTRA = re.compile(r"^\s*(documents|bigbird|longformer)\((.*)\)\s*$")


def _documents(n: int, *, length: int) -> Mask:
    return _masks.segments(torch.arange(length) * n // length)


def _bigbird(block: int, window: int, globals_: int, random: int, seed: int = 0, *, length: int) -> Mask:
    nb = -(-length // block)
    idx = torch.arange(nb)
    layout = (idx[:, None] - idx[None, :]).abs() <= window // 2  # (nb, nb) band
    layout[:globals_, :] = True
    layout[:, :globals_] = True
    g = torch.Generator().manual_seed(seed)
    for row in range(nb):
        layout[row, torch.randperm(nb, generator=g)[:random]] = True
    return _masks.block_layout(layout, block)


def _longformer(window: int, globals_: int, *, length: int) -> Mask:
    return _masks.sliding_window(window, window) | _masks.global_tokens(list(range(globals_)))


def make_mask(text: str | None, length: int) -> Mask | None:
    """The mask a text describes for sequences of ``length`` (None for no mask).

    Example:
        >>> m = make_mask("documents(2)", 4)
        >>> m.materialize(4, 4)[0, 0].int().tolist()
        [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]
    """
    if not text:
        return None
    match = _EXTRA.match(text)
    if match is None:
        return _masks.parse(text)
    try:
        args = ast.literal_eval(f"({match.group(2)},)") if match.group(2).strip() else ()
    except (ValueError, SyntaxError) as err:
        raise ArgumentError(f"mask arguments must be literals in {text!r}") from err
    build = {"documents": _documents, "bigbird": _bigbird, "longformer": _longformer}[match.group(1)]
    try:
        return build(*args, length=length)
    except TypeError as err:
        raise ArgumentError(f"cannot build mask {text!r}: {err}") from err


def make_bias(name: str | None, heads: int):
    """The score modifier called ``name`` for ``heads`` heads (None for no bias)."""
    if name is None:
        return None
    if name == "alibi":
        return _bias.ALiBi(heads)
    if name == "softcap":
        return _bias.Softcap(50.0)
    if name == "relpos":
        modifier = _bias.RelativePositionBias(heads)
        with torch.no_grad():
            modifier.table.copy_(torch.randn(modifier.table.shape, generator=torch.Generator().manual_seed(1)))
        modifier.table.requires_grad_(False)  # a constant, as the dense bias given to SDPA is
        return modifier
    raise ArgumentError(f"bias must be one of {', '.join(BIASES)}; got {name!r}")


def dense_bias(name: str, heads: int, q_len: int, kv_len: int, dtype=torch.float32) -> torch.Tensor | None:
    """The ``(1, H, Lq, Lk)`` float bias equal to an additive modifier; None when it is not additive."""
    if name not in ADDITIVE_BIASES:
        return None
    modifier = make_bias(name, heads)
    h = torch.arange(heads).view(1, -1, 1, 1)
    qi, ki = torch.arange(q_len).view(1, 1, -1, 1), torch.arange(kv_len).view(1, 1, 1, -1)
    zeros = torch.zeros(1, heads, q_len, kv_len)
    return modifier.modify(zeros, torch.zeros(1, 1, 1, 1, dtype=torch.long), h, qi, ki, q_len, kv_len).to(dtype)


def active_pairs(mask: Mask | None, batch: int, heads: int, q_len: int, kv_len: int) -> int:
    """Number of allowed (b, h, query, key) entries, counted a band of query rows at a time."""
    if mask is None:
        return batch * heads * q_len * kv_len
    nb = batch if "b" in mask.uses else 1
    nh = heads if "h" in mask.uses else 1
    b, h = torch.arange(nb).view(-1, 1, 1, 1), torch.arange(nh).view(1, -1, 1, 1)
    ki = torch.arange(kv_len).view(1, 1, 1, -1)
    rows = max(1, (1 << 24) // max(1, nb * nh * kv_len))
    total = 0
    for start in range(0, q_len, rows):
        qi = torch.arange(start, min(q_len, start + rows)).view(1, 1, -1, 1)
        allowed = torch.broadcast_to(mask.allows(b, h, qi, ki, q_len, kv_len), (nb, nh, qi.shape[2], kv_len))
        total += int(allowed.sum())
    return total * (batch // nb) * (heads // nh)
