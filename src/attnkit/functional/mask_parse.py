"""Parse a mask from text, e.g. ``"causal() & sliding_window(128, 0)"`` (CLI, config files).

Only calls to the public constructors of :mod:`attnkit.functional.masks` with
literal arguments, and the operators ``& | ~`` and parentheses, are accepted:
nothing is evaluated as Python.
"""

from __future__ import annotations

import ast

from ..errors import ArgumentError, did_you_mean
from . import masks as _masks
from .mask_base import Mask

__all__ = ["parse"]

_CONSTRUCTORS = {name: getattr(_masks, name) for name in (
    "full", "causal", "sliding_window", "diagonals", "dilated", "strided", "fixed", "global_tokens", "segments",
    "padding", "prefix_lm")}


def _build(node: ast.AST, text: str) -> Mask:
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr)):
        left, right = _build(node.left, text), _build(node.right, text)
        return left & right if isinstance(node.op, ast.BitAnd) else left | right
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
        return ~_build(node.operand, text)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in _CONSTRUCTORS:
        raise ArgumentError(f"cannot parse mask {text!r}: unknown mask {node.func.id!r}; "
                            f"{did_you_mean(node.func.id, _CONSTRUCTORS)}masks: {', '.join(sorted(_CONSTRUCTORS))}")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        try:
            args = [ast.literal_eval(a) for a in node.args]
            kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
        except ValueError as err:
            raise ArgumentError(f"mask arguments must be literals in {text!r}") from err
        try:
            return _CONSTRUCTORS[node.func.id](*args, **kwargs)
        except TypeError as err:  # wrong arguments: say which call of the expression
            raise ArgumentError(f"cannot parse mask {text!r}: {err}") from None
    raise ArgumentError(f"cannot parse mask {text!r}: use calls to {sorted(_CONSTRUCTORS)} joined by & | ~")


def parse(text: str) -> Mask:
    """Build the mask a text describes.

    Example:
        >>> parse("causal() & sliding_window(2, 0)")
        (causal(align='bottom_right') & sliding_window(left=2, right=0, align='bottom_right'))
    """
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as err:
        raise ArgumentError(f"cannot parse mask {text!r}: {err.msg}") from err
    return _build(tree.body, text)
