"""The error contract: every attnkit error names the argument and expected vs actual.

Each class subclasses the builtin a caller would catch (``ValueError`` or
``TypeError``) as well as :class:`AttnkitError`, so ``except ValueError`` keeps
working and ``except attnkit.AttnkitError`` catches everything attnkit raises.
"""

from __future__ import annotations

import torch

__all__ = [
    "AttnkitError",
    "ShapeError",
    "DTypeError",
    "DeviceError",
    "ArgumentError",
    "BackendError",
    "UnsupportedFeature",
    "check_int",
    "check_bool_mask",
]


class AttnkitError(Exception):
    """Base class of every error raised by attnkit."""


class ShapeError(AttnkitError, ValueError):
    """A tensor has the wrong rank or size (the message shows expected vs got)."""


class DTypeError(AttnkitError, TypeError):
    """A tensor has the wrong dtype, or an argument has the wrong type."""


class DeviceError(AttnkitError, ValueError):
    """Tensors that must share a device do not."""


class ArgumentError(AttnkitError, ValueError):
    """A scalar argument is out of range or an option is unknown."""


class BackendError(AttnkitError, ValueError):
    """A forced backend cannot honour every argument of the call."""


class UnsupportedFeature(AttnkitError, ValueError):
    """A model asks attention for something attnkit cannot honour exactly (e.g. attention sinks)."""


def check_int(who: str | None, name: str, value, minimum: int = 0, hint: str = "") -> int:
    """``value`` as an int ``>= minimum`` (bools refused), else an :class:`ArgumentError` naming it.

    ``who`` prefixes the message (``"LuongAttention: window must be ..."``); ``hint``
    follows the bound, e.g. what the number means.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        prefix = f"{who}: " if who else ""
        raise ArgumentError(f"{prefix}{name} must be an int >= {minimum}{hint}; got {value!r}")
    return value


def check_bool_mask(who: str, name: str, mask, shape: tuple[int, ...], *, true_means: str = "keep",
                    dims: str = ""):
    """``mask`` unchanged if it is a bool tensor of exactly ``shape`` (None passes), else a named error.

    Raises :class:`DTypeError` for a non-bool value and :class:`ShapeError` for another shape,
    each naming ``who``, the argument and expected vs actual. ``true_means`` and ``dims`` (e.g.
    ``"(batch, n)"``) only word the message.
    """
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__
        raise DTypeError(f"{who}: {name} must be a bool tensor (True = {true_means}); got {got}")
    if tuple(mask.shape) != tuple(shape):
        expected = f"{dims} = {tuple(shape)}" if dims else f"{tuple(shape)}"
        raise ShapeError(f"{who}: {name} must have shape {expected}; got {tuple(mask.shape)}")
    return mask
