"""Parse a mask from text, e.g. ``"causal() & sliding_window(128, 0)"`` (CLI, config files).

Only calls to the constructors it is given (:func:`attnkit.masks.parse` gives the
built-in ones) with literal arguments, and the operators ``& | ~`` and parentheses,
are accepted: nothing is evaluated as Python.
"""

from __future__ import annotations

import ast

from ..errors import ArgumentError, did_you_mean
from .base import Mask

__all__ = ["parse"]


def _build(node: ast.AST, text: str, constructors: dict) -> Mask:
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr)):
        left, right = _build(node.left, text, constructors), _build(node.right, text, constructors)
        return left & right if isinstance(node.op, ast.BitAnd) else left | right
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
        return ~_build(node.operand, text, constructors)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id not in constructors:
        raise ArgumentError(f"cannot parse mask {text!r}: unknown mask {node.func.id!r}; "
                            f"{did_you_mean(node.func.id, constructors)}masks: {', '.join(sorted(constructors))}")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        try:
            args = [ast.literal_eval(a) for a in node.args]
            kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
        except ValueError as err:
            raise ArgumentError(f"mask arguments must be literals in {text!r}") from err
        try:
            return constructors[node.func.id](*args, **kwargs)
        except TypeError as err:  # wrong arguments: say which call of the expression
            raise ArgumentError(f"cannot parse mask {text!r}: {err}") from None
    raise ArgumentError(f"cannot parse mask {text!r}: use calls to {sorted(constructors)} joined by & | ~")


def parse(text: str, constructors: dict) -> Mask:
    """Build the mask a text describes from ``constructors`` (name -> function)."""
    try:
        return _build(ast.parse(text.strip(), mode="eval").body, text, constructors)
    except SyntaxError as err:
        raise ArgumentError(f"cannot parse mask {_short(text)}: {err.msg}") from err
    except (RecursionError, MemoryError):  # Python's parser, or the build, nested past the interpreter's limit
        raise ArgumentError(f"cannot parse mask {_short(text)}: nested too deeply (write ~~m as m, and combine "
                            "long chains with & and | at one level)") from None


def _short(text: str) -> str:
    """The text as errors quote it: at most 80 characters."""
    return repr(text) if len(text) <= 80 else repr(text[:77] + "...")
