"""Pixel-sequence tasks: an image ``side x side`` read as ``length = side^2`` tokens, row by row.

``resolve_side(who, length, side)``: the task's ``(length, side)`` from either (default side 32);
``length`` must be a square. Token ids are pixel levels plus one (0 stays free for padding).

Example:
    >>> from attnkit.lab.tasks.pixels import resolve_side
    >>> resolve_side("T", None, None), resolve_side("T", 256, None), resolve_side("T", None, 8)
    ((1024, 32), (256, 16), (64, 8))
"""

from __future__ import annotations

import math

from ...errors import ArgumentError, check_int

__all__ = ["resolve_side"]


def resolve_side(who: str, length: int | None, side: int | None, *, default: int = 32,
                 smallest: int = 4) -> tuple[int, int]:
    """``(length, side)`` with ``length = side^2``, from whichever is given (``side = default`` if neither)."""
    if side is not None:
        check_int(who, "side", side, smallest)
    if length is not None:
        check_int(who, "length", length, smallest * smallest, f" (an image of side >= {smallest})")
        root = math.isqrt(length)
        if root * root != length:
            raise ArgumentError(f"{who}: length must be a square (side x side pixels); got {length}")
        if side is not None and side != root:
            raise ArgumentError(f"{who}: length must be side^2 = {side * side} when both are given; got {length}")
        return length, root
    side = default if side is None else side
    return side * side, side
